"""What arrives: Event Grid events and HTTP requests, parsed into one typed trigger request or a rejection.

triggers.py holds the values (`TriggerRequest`, `Rejection`, the decision words); envelope.py reads either
Event Grid schema; blob_created.py, drift_alerts.py and http_retrain.py parse one family each; parsing.py
dispatches. Pure functions: settings and the clock are passed in.
"""
