"""`retrain ...` as a terminal starts it: a process of its own, in a session of its own, against a state
folder of its own; and a wait for its run's train step to be running, read from the run's record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from components.local.runs import RUN_FILE
from components.model_config import MODELS_DIR_VARIABLE
from components.request import RUNNING
from components.specs import REPO_ROOT
from training.local_state import STATE_DIR_VARIABLE

RUNNING_TIMEOUT_S = 300.0
SMALL_RUN = [
    "--task", "tabular", "--task-option", "hidden_width=16", "--epochs", "3",
    "--param", "global_batch_size=32", "--param", "checkpoint_every_steps=10",
    "--param", "checkpoint_every_seconds=off", "--param", "mlflow_tracking_uri=off",
]  # fmt: skip


def retrain_environ(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        STATE_DIR_VARIABLE: str(home),
        MODELS_DIR_VARIABLE: str(home.parent / "no-model-configs"),
        "PYTHONPATH": str(REPO_ROOT),
    }


def start_retrain(home: Path, *argv: str) -> subprocess.Popen[str]:
    """`retrain ...` in a process of its own, in a session of its own (as a terminal starts it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "retrain_cli", *argv],
        cwd=REPO_ROOT, env=retrain_environ(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def finished_retrain(home: Path, *argv: str) -> str:
    """What `retrain ...` printed, once it has ended well (its log records, on stderr, left out)."""
    process = start_retrain(home, *argv)
    output, errors = process.communicate(timeout=600)
    assert process.returncode == 0, (output + errors)[-4000:]
    return output


def run_id_once_train_runs(home: Path, process: subprocess.Popen[str]) -> str:
    """The run's id, once its record shows its train step running (polling the record the runner
    rewrites as each step changes state)."""
    deadline = time.monotonic() + RUNNING_TIMEOUT_S
    while True:
        for record_file in (home / "runs").glob(f"*/{RUN_FILE}"):
            record = json.loads(record_file.read_text())  # written atomically: always whole
            if any(step["name"] == "train" and step["status"] == RUNNING for step in record["steps"]):
                return record["run_id"]
        assert process.poll() is None, f"the run ended (exit {process.returncode}) before train ran"
        assert time.monotonic() < deadline, f"train did not start within {RUNNING_TIMEOUT_S:.0f} s"
        time.sleep(0.05)
