"""A local run's steps start warm (components/local/warm.py): forked by one starter that has imported
torch and MLflow. Nothing else about the run may change: a warm run trains the very weights a cold one
does and the gate decides alike; and a runner killed alone leaves nothing of its run behind, the starter
and torchrun's agent and workers included (the workers see their agent die and leave, as when the runner
itself was their agent's parent)."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
from helpers.components.run_requests import SMALL_MODEL, SMALL_TRAINING, pinned_request
from helpers.components.terminal_runs import SMALL_RUN, run_id_once_train_runs, start_retrain

from components.local import LocalRunner, RunnerOptions
from components.local.runs import STEP_PID_FILE
from components.local.starter_pool import IDLE_STARTERS
from components.local.warm import WarmLauncher
from components.request import COMPLETED
from components.specs import REPO_ROOT
from retrain_cli import warm_start_ahead

TREE_TIMEOUT_S = 120.0


def _trained(state: Path, raw: Path, warm: bool) -> tuple[dict, dict]:
    runner = LocalRunner(RunnerOptions(state_root=state, warm_start=warm), os.environ, io.StringIO())
    record = runner.run(pinned_request(state, raw, parameters=SMALL_TRAINING, task_options=SMALL_MODEL))
    assert record.status == COMPLETED
    [train] = [step for step in record.steps if step.name == "train"]
    metadata = json.loads((Path(train.outputs["model"]) / "metadata.json").read_text())
    registration = json.loads((Path(record.outputs["registration"]) / "registration.json").read_text())
    return metadata, registration


def _kept_starter() -> int | None:
    """The pid of the starter this process keeps idle between runs, if any."""
    kept = IDLE_STARTERS.take(sys.executable, REPO_ROOT, os.environ)
    if kept is None:
        return None
    IDLE_STARTERS.give_back(sys.executable, kept)
    return kept.process.pid


def test_a_warm_run_trains_the_weights_a_cold_run_does_and_the_gate_decides_alike(sample_raw, tmp_path):
    cold, cold_registration = _trained(tmp_path / "cold", sample_raw, warm=False)
    warm, warm_registration = _trained(tmp_path / "warm", sample_raw, warm=True)
    assert warm["weights_sha256"] == cold["weights_sha256"]
    assert (warm["steps"], warm["data_version"]) == (cold["steps"], cold["data_version"])
    assert warm["final_metrics"] == cold["final_metrics"]
    assert warm_registration["decision"] == cold_registration["decision"]
    assert warm_registration["metrics"] == cold_registration["metrics"]

    # The next run in this process forks its steps from the same starter, kept idle in between, and
    # trains the same weights again.
    kept = _kept_starter()
    assert kept is not None and psutil.Process(kept).ppid() == os.getpid()
    again, _ = _trained(tmp_path / "again", sample_raw, warm=True)
    assert again["weights_sha256"] == cold["weights_sha256"]
    assert _kept_starter() == kept


def test_a_runner_killed_alone_mid_training_leaves_no_process_of_its_run(sample_raw, tmp_path):
    home = tmp_path / "home"
    long_run = [
        *SMALL_RUN[: SMALL_RUN.index("--epochs")],
        "--epochs",
        "400",
        *SMALL_RUN[SMALL_RUN.index("--epochs") + 2 :],
    ]
    runner = start_retrain(home, "run", "--data", str(sample_raw), *long_run, "--nproc", "2")
    try:
        run_id = run_id_once_train_runs(home, runner)
        pid_file = home / "runs" / run_id / "train" / STEP_PID_FILE
        tree = _train_tree(runner, pid_file)
    finally:
        os.kill(runner.pid, signal.SIGKILL)  # the runner alone: not its group, not its step
        runner.communicate()

    gone, alive = psutil.wait_procs(tree, timeout=TREE_TIMEOUT_S)
    assert not alive, f"left running after their runner died: {[p.info for p in alive]}"
    assert len(gone) >= 4  # the starter, torchrun's agent, its two workers


def _train_tree(runner, pid_file: Path) -> list[psutil.Process]:
    """The starter, the train step's agent and its workers, once both workers are running."""
    deadline = time.monotonic() + TREE_TIMEOUT_S
    while True:
        assert runner.poll() is None, "the run ended before its workers were seen"
        assert time.monotonic() < deadline, "the train step's two workers did not start"
        if pid_file.exists():
            try:
                agent = psutil.Process(int(pid_file.read_text()))
                workers = agent.children()
                starter = psutil.Process(runner.pid).children()
            except (psutil.NoSuchProcess, ValueError):
                continue  # between two states: look again
            if len(workers) == 2 and starter:
                return [*starter, agent, *workers]
        time.sleep(0.05)


def test_retrain_run_starts_its_starter_before_its_imports_and_its_runner_adopts_that_one():
    environ = dict(os.environ)
    with warm_start_ahead(["-v", "run", "--data", "RAW"], environ) as ahead:
        assert ahead is not None and ahead.serves(REPO_ROOT, environ)
        launcher = WarmLauncher(sys.executable, starter=ahead)
        launcher.warm_up(REPO_ROOT, environ)
        assert launcher._starter is ahead  # adopted: no second starter
        # Steps of other interpreter settings: the one started ahead, still unused, makes way for theirs.
        other = {**environ, "PYTHONSTARTERTEST": "other"}  # any PYTHON* variable counts
        launcher.warm_up(REPO_ROOT, other)
        assert ahead.process.poll() is not None
        assert launcher._starter is not None and launcher._starter.serves(REPO_ROOT, other)
        launcher.close()
    with warm_start_ahead(["run"], environ) as unused:
        assert unused is not None
    assert unused.process.poll() is not None  # a run that never used it ends it all the same
    for argv, setting in ((["runs"], "on"), (["run"], "off"), (["run"], "sometimes")):
        with warm_start_ahead(argv, {**environ, "RETRAIN_WARM_START": setting}) as none:
            assert none is None, (argv, setting)  # an unknown setting is the run's to refuse, in its words
