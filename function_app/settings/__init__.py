"""The app settings: environment variables in, one validated frozen value out (app.py), with the storage
settings' rules (storage.py)."""
