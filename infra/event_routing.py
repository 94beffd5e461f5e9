"""infra/event-routing.json: what the Event Grid subscriptions filter on, derived from the front door's code.

Bicep cannot read the models' TOML files, so the deployment loads this JSON
(infra/modules/subscriptions.bicep) and tests/infra/ holds it equal to what `event_routing()` derives now.
After changing models/*.toml, run

    python -m infra.event_routing

which rewrites the file for RETRAIN_MODELS=* (every models/*.toml; `--models digits,shapes` serves fewer).
RETRAIN_MODELS_DIR moves the models' folder, as it does for the front door. A model that cannot be routed
(a bad file, a scope in another account, a user's task whose raw_suffixes only running it could tell) is
one line on stderr naming the file and the expected form, and exit code 2; the routing file is then left
as it was.
A model whose [trigger] names no account or container lands in the deployment's account and its landing
container (the RETRAIN_BLOB_* defaults the Function App is given); one that names another account is refused:
the deployment's system topic sees its own account only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.model_config import MODELS_DIR_VARIABLE
from core.errors import RetrainError
from core.files import write_atomically
from core.secrets import mask_secrets
from function_app.events.blob_created import COMMIT_APIS
from function_app.events.drift_alerts import (
    DATASET_DRIFT_DETECTED,
    RETRAIN_DRIFT_DETECTED,
    RUN_STATUS_CHANGED,
)
from function_app.settings.served import ALL_MODELS, MODELS, served_models
from function_app.settings.storage import BLOB_ACCOUNT, BLOB_CONTAINER, SettingsError

ROOT = Path(__file__).resolve().parents[1]
ROUTING_FILE = ROOT / "infra" / "event-routing.json"
# Stand-in for the account the deployment creates (its name is known only at deployment): a model whose
# scope resolves to another account is not the deployment's to subscribe to.
DEPLOYMENT_ACCOUNT = "deploymentaccount"
LANDING_CONTAINER = "landing"  # infra/main.bicep's containers.landing
REGENERATE = "python -m infra.event_routing"


def event_routing(
    models: str = ALL_MODELS, root: Path = ROOT, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The served models (RETRAIN_MODELS), the commit APIs, the drift event types, and one Event Grid filter
    per model that takes blob events: the subject prefix of its container and folder, and its suffixes.
    The models' files are read from `root`'s models folder, or the one RETRAIN_MODELS_DIR in `environ`
    names (relative to `root`, as the front door reads it relative to the app root)."""
    values = {MODELS: models, BLOB_ACCOUNT: DEPLOYMENT_ACCOUNT, BLOB_CONTAINER: LANDING_CONTAINER}
    folder = (environ or {}).get(MODELS_DIR_VARIABLE, "").strip()
    if folder:
        values[MODELS_DIR_VARIABLE] = folder
    subscriptions = []
    for route in served_models(values, root) or ():
        scope = route.scope
        if scope is None:
            continue  # no landing blobs: drift alerts and HTTP requests only
        if scope.account != DEPLOYMENT_ACCOUNT:
            raise SettingsError(
                f"{route.source}: [trigger] account {scope.account!r} is not the deployment's storage "
                "account; expected no account in [trigger] (the deployment's is used)"
            )
        folder = f"{scope.prefix}/" if scope.prefix else ""
        subscriptions.append(
            {
                "model": route.name,
                "subjectBeginsWith": f"/blobServices/default/containers/{scope.container}/blobs/{folder}",
                "suffixes": list(scope.suffixes),
            }
        )
    return {
        "servedModels": models,
        "commitApis": list(COMMIT_APIS),
        # separate subscriptions: the monitor's events are filtered on their breach tag, which v1's lack
        "monitorEventType": RUN_STATUS_CHANGED,
        "datasetDriftEventType": DATASET_DRIFT_DETECTED,
        "driftDetectedEventType": RETRAIN_DRIFT_DETECTED,
        "subscriptions": subscriptions,
    }


def render(routing: dict[str, Any]) -> str:
    return json.dumps(routing, indent=2) + "\n"


def main(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None, routing_file: Path = ROUTING_FILE
) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--models", default=ALL_MODELS, help="RETRAIN_MODELS: * or names separated by commas")
    args = parser.parse_args(argv)
    try:
        routing = event_routing(args.models, ROOT, os.environ if environ is None else environ)
    except RetrainError as error:  # a model's file, scope or task: one line, the file left as it was
        print(f"{REGENERATE}: error: {mask_secrets(str(error))}", file=sys.stderr)
        return 2
    write_atomically(routing_file, render(routing).encode())
    shown = routing_file.relative_to(ROOT) if routing_file.is_relative_to(ROOT) else routing_file
    print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
