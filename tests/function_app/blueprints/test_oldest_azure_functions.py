"""The Event Grid functions on the oldest azure-functions a Functions host may load (the pin in
requirements-azure-functions-oldest.txt, which `make` installs apart into .azure-functions-oldest/): one
fresh process with that library first on its path imports the root entry, indexes its functions once, and
is handed Microsoft's documented sample events the way the worker hands them over under that library."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.function_app.corpus import ACCOUNT, CONTAINER
from helpers.function_app.microsoft_samples import (
    BLOB_CREATED_CLOUD_EVENT,
    BLOB_CREATED_EVENT_GRID,
    CLOUD_EVENT_BLOB,
    EVENT_GRID_BLOB,
    RUN_STATUS_CHANGED,
)

ROOT = Path(__file__).resolve().parents[3]
HARNESS = ROOT / "tests" / "helpers" / "function_app" / "host_library_harness.py"
OLDEST = ROOT / ".azure-functions-oldest"
PIN = ROOT / "requirements-azure-functions-oldest.txt"
BLOB, DRIFT = "on_blob_created", "on_drift_alert"
WAITING = {"RETRAIN_DEBOUNCE_QUIET_SECONDS": "3600", "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": "3600"}
BREACH = "has failed due to one or more features violating metric thresholds"
TAG = "azureml_modelmonitor_threshold_breached"
RUN = RUN_STATUS_CHANGED["data"]["runId"]
JOINED = "joined the pending batch; it is submitted after the quiet period"


def _pinned_version() -> str:
    [version] = re.findall(r"^azure-functions==(\S+)$", PIN.read_text(), flags=re.MULTILINE)
    return version


def _monitored(event: dict) -> dict:
    """The documented RunStatusChanged, as Azure ML's model monitor tags a signal run that breached."""
    data = {**event["data"], "runTags": {TAG: BREACH}}
    return {**event, "id": "model-monitor-run", "data": data}


def test_the_event_grid_functions_decide_microsofts_samples_on_the_oldest_library(app_settings, tmp_path):
    assert (OLDEST / "azure" / "functions").is_dir(), f"{OLDEST} is missing; `make` installs it"
    deliveries = [
        (BLOB, BLOB_CREATED_EVENT_GRID),
        (BLOB, BLOB_CREATED_CLOUD_EVENT),
        (DRIFT, RUN_STATUS_CHANGED),
        (DRIFT, _monitored(RUN_STATUS_CHANGED)),
    ]
    path = os.pathsep.join(
        [str(OLDEST), str(ROOT), str(HARNESS.parent)]
    )  # ahead of the venv's azure-functions
    env = {**os.environ, **app_settings(tmp_path / "home", **WAITING), "PYTHONPATH": path}

    done = subprocess.run(
        [sys.executable, str(HARNESS)],
        input=json.dumps(deliveries),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["version"] == _pinned_version()
    assert Path(report["file"]).is_relative_to(OLDEST)
    assert report["bindings"][BLOB] == report["bindings"][DRIFT] == ["eventGridTrigger"]
    assert report["raised"] == [None] * len(deliveries)
    decisions = [(e["kind"], e["decision"], e["reason"]) for e in report["ledger"]["events"]]
    assert sorted(decisions) == sorted(
        [
            ("blob", "debounced", JOINED),
            ("blob", "debounced", JOINED),
            ("drift", "rejected", f"run {RUN}'s tags carry no {TAG}: a run status change, not a drift alert"),
            ("drift", "accepted", "accepted for the next run"),
        ]
    ), json.dumps(report["ledger"], indent=1)
    blobs = {e["item"]["blob"]["url"] for e in report["ledger"]["events"] if e["kind"] == "blob"}
    endpoint = f"https://{ACCOUNT}.blob.core.windows.net/{CONTAINER}"
    assert blobs == {f"{endpoint}/{EVENT_GRID_BLOB}", f"{endpoint}/{CLOUD_EVENT_BLOB}"}
