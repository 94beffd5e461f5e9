"""The Azure ML side: the workspace seam, the submitter with its quota check and dedicated fallback,
data assets, publishing and schedules. azure-ai-ml is imported lazily everywhere in this package."""
