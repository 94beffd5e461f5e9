"""`retrain run` as the root command line runs it, for the end-to-end tests of tasks other than the
digits (test_readme_task.py; the image task's end-to-end run is the demo's image chapter)."""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

from components.local import RunRecord, RunStore
from components.local import cli as local_cli
from components.model_config import MODELS_DIR_VARIABLE
from components.request import COMPLETED

QUICK = ["--param", "checkpoint_every_seconds=off", "--param", "mlflow_tracking_uri=off"]


def retrain_run(state: Path, models: Path, *argv: str) -> tuple[RunRecord, dict, str]:
    """`retrain run ...` as the root CLI runs it, with `models` as the configuration folder; the newest
    run's record, its registration.json and what the command printed."""
    parser = argparse.ArgumentParser(prog="retrain")
    local_cli.register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["run", *argv])
    args.state_root, args.environ = state, {**os.environ, MODELS_DIR_VARIABLE: str(models)}
    out = io.StringIO()
    try:
        assert args.handler(args, out) == 0
    finally:
        print(out.getvalue())  # shown by pytest when a test fails
    record = RunStore(state / "runs").list(limit=1)[0]
    assert record.status == COMPLETED
    registration = json.loads((Path(record.outputs["registration"]) / "registration.json").read_text())
    return record, registration, out.getvalue()
