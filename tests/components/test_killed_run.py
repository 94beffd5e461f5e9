"""A `retrain run` killed outright (SIGKILL to its whole process group: a closed terminal's session, the
OOM killer) can write nothing more. `retrain runs` shows it Abandoned, naming the step it died in and the
runner that is gone (its pid and start time: a reused pid is no runner), never Running forever, also once
a later run of the same data has completed beside it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from components.local import RunStore
from components.local.runs import ABANDONED, RUN_FILE
from components.model_config import MODELS_DIR_VARIABLE
from components.request import COMPLETED, RUNNING
from components.specs import REPO_ROOT
from training.local_state import STATE_DIR_VARIABLE

RUNNING_TIMEOUT_S = 300.0
SMALL_RUN = [
    "--task", "tabular", "--task-option", "hidden_width=16", "--epochs", "3",
    "--param", "global_batch_size=32", "--param", "checkpoint_every_steps=10",
    "--param", "checkpoint_every_seconds=off", "--param", "mlflow_tracking_uri=off",
]  # fmt: skip


def _environ(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        STATE_DIR_VARIABLE: str(home),
        MODELS_DIR_VARIABLE: str(home.parent / "no-model-configs"),
        "PYTHONPATH": str(REPO_ROOT),
    }


def _retrain(home: Path, *argv: str) -> subprocess.Popen[str]:
    """`retrain ...` in a process of its own, in a session of its own (as a terminal starts it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "retrain_cli", *argv],
        cwd=REPO_ROOT, env=_environ(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def _finished(home: Path, *argv: str) -> str:
    """What `retrain ...` printed, once it has ended well (its log records, on stderr, left out)."""
    process = _retrain(home, *argv)
    output, errors = process.communicate(timeout=600)
    assert process.returncode == 0, (output + errors)[-4000:]
    return output


def _run_id_once_train_runs(home: Path, process: subprocess.Popen[str]) -> str:
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


def test_a_run_killed_with_its_process_group_is_abandoned_in_retrain_runs_not_running(sample_raw, tmp_path):
    home = tmp_path / "home"
    killed = _retrain(home, "run", "--data", str(sample_raw), *SMALL_RUN)
    try:
        run_id = _run_id_once_train_runs(home, killed)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)  # the runner and everything of its group, at once
        killed.communicate()
    assert killed.returncode == -signal.SIGKILL

    listed = _finished(home, "runs")

    lines = listed.splitlines()
    assert lines[0].startswith(f"{run_id}  {ABANDONED}  ")
    assert lines[1].startswith(f"  error: abandoned during step 'train': its runner (pid {killed.pid} on ")
    assert lines[1].endswith(") ended before the run did")
    assert lines[3].split()[:2] == ["train", ABANDONED]

    # A later run of the same data completes; the killed one stays what it was.
    _finished(home, "run", "--data", str(sample_raw), *SMALL_RUN)
    newer, older = RunStore(home / "runs").list()
    assert (newer.status, older.run_id, older.status) == (COMPLETED, run_id, ABANDONED)
    records = json.loads(_finished(home, "runs", "--json"))
    assert [(record["run_id"], record["status"]) for record in records] == [
        (newer.run_id, COMPLETED), (run_id, ABANDONED)
    ]  # fmt: skip
