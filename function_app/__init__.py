"""Retrain's front door: WHEN a retraining runs.

Event Grid and HTTP triggers turn events into one typed trigger request, a pure policy decides, and a
submission of the pipeline follows. This package imports `components/` to build and submit pipelines and
never imports torch or mlflow: the Function App deploys with the root `requirements.txt` only, and
azure-ai-ml is imported lazily where a submission happens, to keep cold starts fast.
"""
