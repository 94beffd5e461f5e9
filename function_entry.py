"""The Functions worker's entry file: the app setting PYTHON_SCRIPT_FILE_NAME names it (docs/architecture.md,
"The Functions entry file").

It cannot be called function_app.py: the package `function_app/` would shadow it. Importing it validates
the app settings first, so a bad setting stops start-up with a message naming it, and then registers one
blueprint per trigger family. It imports neither torch, nor mlflow, nor azure-ai-ml (tested).
"""

from __future__ import annotations

import os

import azure.functions as func

from function_app.blueprints import blob_events, drift_events, http_api, timer
from function_app.runtime import start

start(os.environ)

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
for family in (blob_events, drift_events, http_api, timer):
    app.register_functions(family.blueprint)
