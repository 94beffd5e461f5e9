"""A preempted train step resumes: eviction is simulated by SIGTERM to the running train step's process
group after its first checkpoint, as a low-priority node's eviction notice would arrive."""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import threading
import time
from pathlib import Path

from conftest import SMALL_TRAINING, pinned_request

from components.local import LocalRunner, RunnerOptions, RunRecord
from components.request import COMPLETED

# More epochs than the other tests: training must still be running when the eviction notice arrives.
EPOCHS = 8
CHECKPOINT_TIMEOUT_S = 120.0


def wait_for_first_checkpoint(folder: Path, runner_thread: threading.Thread) -> None:
    """Until a committed checkpoint record (`*.json`, written after its data) is in `folder`."""
    deadline = time.monotonic() + CHECKPOINT_TIMEOUT_S
    while not any(folder.glob("*.json")):
        assert runner_thread.is_alive(), "the run ended before the train step's first checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint in {folder} after {CHECKPOINT_TIMEOUT_S:.0f} s"
        time.sleep(0.005)


def test_an_evicted_train_step_is_restarted_resumes_from_its_checkpoint_and_the_run_completes(
    tmp_path: Path, sample_raw: Path
):
    state = tmp_path / "state"
    started: queue.Queue[tuple[str, int, int]] = queue.Queue()
    runner = LocalRunner(
        RunnerOptions(state_root=state),
        os.environ,
        io.StringIO(),
        on_process_started=lambda step, attempt, pid: started.put((step, attempt, pid)),
    )
    request = pinned_request(state, sample_raw, parameters={**SMALL_TRAINING, "epochs": EPOCHS})
    outcome: dict[str, RunRecord | BaseException] = {}

    def run() -> None:
        try:
            outcome["record"] = runner.run(request)
        except BaseException as error:
            outcome["error"] = error

    runner_thread = threading.Thread(target=run, name="runner")
    runner_thread.start()
    try:
        step, attempt, pid = started.get(timeout=CHECKPOINT_TIMEOUT_S)
        while step != "train":
            step, attempt, pid = started.get(timeout=CHECKPOINT_TIMEOUT_S)
        assert attempt == 1
        train_folder = next((state / "runs").iterdir()) / "train"
        assert (train_folder / "pid").read_text().strip() == str(pid)
        wait_for_first_checkpoint(state / "checkpoints" / request.run_key, runner_thread)
        os.killpg(pid, signal.SIGTERM)
    finally:
        runner_thread.join()

    assert "error" not in outcome, outcome.get("error")
    record = outcome["record"]
    assert isinstance(record, RunRecord)
    assert record.status == COMPLETED
    train = record.step("train")
    assert [attempt.exit_code for attempt in train.attempts] == [75, 0]
    log = Path(train.log).read_text()
    assert "SIGTERM received: saving after the current step" in log
    assert "resumed from checkpoint" in log
    metadata = json.loads((Path(train.outputs["model"]) / "metadata.json").read_text())
    assert metadata["evictions_survived"] == 1
    assert [entry["ended"] for entry in metadata["attempts"]] == ["preempted", "completed"]
    assert (Path(record.outputs["registration"]) / "registration.json").is_file()
    assert not (train_folder / "pid").exists()

    # The checkpoints changed during the run, but they are no part of the train step's cache key.
    again = runner.run(request)
    assert [step.reused for step in again.steps] == [True, True, True, True]
