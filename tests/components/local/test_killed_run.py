"""A `retrain run` killed outright (SIGKILL to its whole process group: a closed terminal's session, the
OOM killer) can write nothing more. `retrain runs` shows it Abandoned, naming the step it died in and the
runner that is gone (its pid and start time: a reused pid is no runner), never Running forever, also once
a later run of the same data has completed beside it."""

from __future__ import annotations

import json
import os
import signal

from helpers.components.terminal_runs import (
    SMALL_RUN,
    finished_retrain,
    run_id_once_train_runs,
    start_retrain,
)

from components.local import RunStore
from components.local.runs import ABANDONED
from components.request import COMPLETED


def test_a_run_killed_with_its_process_group_is_abandoned_in_retrain_runs_not_running(sample_raw, tmp_path):
    home = tmp_path / "home"
    killed = start_retrain(home, "run", "--data", str(sample_raw), *SMALL_RUN)
    try:
        run_id = run_id_once_train_runs(home, killed)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)  # the runner and everything of its group, at once
        killed.communicate()
    assert killed.returncode == -signal.SIGKILL

    listed = finished_retrain(home, "runs")

    lines = listed.splitlines()
    assert lines[0].startswith(f"{run_id}  {ABANDONED}  ")
    assert lines[1].startswith(f"  error: abandoned during step 'train': its runner (pid {killed.pid} on ")
    assert lines[1].endswith(") ended before the run did")
    assert lines[3].split()[:2] == ["train", ABANDONED]

    # A later run of the same data completes; the killed one stays what it was.
    finished_retrain(home, "run", "--data", str(sample_raw), *SMALL_RUN)
    newer, older = RunStore(home / "runs").list()
    assert (newer.status, older.run_id, older.status) == (COMPLETED, run_id, ABANDONED)
    records = json.loads(finished_retrain(home, "runs", "--json"))
    assert [(record["run_id"], record["status"]) for record in records] == [
        (newer.run_id, COMPLETED), (run_id, ABANDONED)
    ]  # fmt: skip
