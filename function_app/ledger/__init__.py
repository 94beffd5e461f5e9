"""The durable record of every event, decision and submission (records.py): one ledger (ledger.py) on a
small record store (store.py) with a local-folder twin (local.py) and a Blob Storage twin (blob.py)."""
