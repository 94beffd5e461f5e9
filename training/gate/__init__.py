"""The way into the registry: evaluation, the gate's policy, registration, the MLflow registry and lineage."""
