"""The durable record of every event, decision and submission (records.py), in a local folder (local.py) or
Blob Storage (blob.py)."""
