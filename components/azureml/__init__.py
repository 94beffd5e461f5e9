"""The Azure ML twin: the job builder, the submitter with its quota check and dedicated fallback, its dry run,
the workspace seam, code and blob snapshots with their retention, data assets, publishing, schedules and
`retrain submit|publish|schedule`. The deployed front door imports it; azure-ai-ml is imported lazily
everywhere in this package."""
