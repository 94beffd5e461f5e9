"""A loss made non-finite inside training stops it with the documented code (issue 14, item 4).

The loss goes wrong inside a real training, through a user's task (tests/helpers/training/diverging_task.py),
at a step where an interval save is due: the agreed verdict on that step arrives only one step later, and the
save must not wait for it to keep poisoned state out of the checkpoints.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from helpers.training.run_outputs import newest_record
from helpers.training.small_run import NO_TRACKING, train_arguments

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import committed_checkpoints
from training.engine.distributed import init_distributed
from training.engine.divergence import DIVERGED_EXIT_CODE
from training.engine.preemption import PreemptionNotice
from training.engine.train_args import add_train_arguments, config_from_args
from training.engine.trainer import DIVERGED, Trainer
from training.tasks.loader import load_task

TASK = str(Path(__file__).parents[1] / "helpers" / "training" / "diverging_task.py") + ":DivergingTabular"


def diverging(at_step: int, *options: str, epochs: int = 3) -> list[str]:
    extra = ["--task", TASK, "--task-option", f"diverge_at_step={at_step}", "--epochs", str(epochs)]
    for option in options:
        extra += ["--task-option", option]
    return extra


def error_lines(folders) -> list[str]:
    return [
        line
        for line in (folders.logs / "attempt-1.log").read_text().splitlines()
        if "retrain: error:" in line
    ]


def tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in tensors(item)]
    if isinstance(value, list | tuple):
        return [tensor for item in value for tensor in tensors(item)]
    return []


def assert_stopped_cleanly(folders, newest_step: int) -> None:
    """Nothing in --out, and the newest checkpoint is the last good one: made before the divergence, nothing
    saved after it, and its weights and optimizer state all finite."""
    assert not (folders.out / "model.pt").exists() and not (folders.out / "metadata.json").exists()
    store = LocalCheckpointStore(Path(folders.checkpoints))
    assert newest_record(folders.checkpoints).step == newest_step
    assert all(int(name.split("-")[1]) <= newest_step for name in committed_checkpoints(store.names()))
    loaded = Checkpointer(store, keep_last=2).newest_valid()
    assert loaded is not None and loaded.record.step == newest_step
    state = tensors(loaded.state["model"]) + tensors(loaded.state["optimizer"])
    assert state and all(bool(torch.isfinite(tensor).all()) for tensor in state)


def diverged_event(process) -> dict:
    return next(event for event in process.events_seen if event["event"] == "diverged")


@pytest.mark.parametrize(
    ("poison", "stopped_at"),
    [
        ("inf", 20),  # the loss of step 20 is infinite
        ("gradient", 21),  # step 20's loss is finite but its gradients are not: its weights show it
    ],
)
def test_a_non_finite_step_stops_the_run_with_code_65_and_keeps_the_last_good_checkpoint(
    start_training, folders, poison, stopped_at
):
    process = start_training(nproc=1, extra=diverging(20, f"poison={poison}"))

    assert process.finish() == DIVERGED_EXIT_CODE
    [line] = error_lines(folders)
    assert line.startswith(f"retrain: error: training diverged at step {stopped_at}: its loss is ")
    assert "--learning-rate" in line
    assert diverged_event(process)["step"] == stopped_at
    assert max(event["step"] for event in process.events_seen if event["event"] == "step") <= stopped_at + 1
    # Step 20's save was due (every 10 steps) after its poisoned update, before any verdict on it.
    assert_stopped_cleanly(folders, newest_step=10)


def test_one_rank_s_non_finite_loss_stops_every_rank_and_retrain_train_exits_65(start_training, folders):
    # Only rank 1's loss goes wrong: rank 0, which saves, learns it from the agreed mean loss.
    process = start_training(nproc=2, extra=diverging(20, "ranks=[1]"))

    assert process.finish() == DIVERGED_EXIT_CODE
    [line] = error_lines(folders)
    assert line.startswith("retrain: error: training diverged at step 20: its loss is inf;")
    output = (folders.logs / "attempt-1.log").read_text()
    assert "Traceback" not in output and "ChildFailedError" not in output, output  # torchrun's, not shown
    assert diverged_event(process)["step"] == 20
    assert_stopped_cleanly(folders, newest_step=10)


class RecordingTracker:
    """Where a tracked run would go (training/engine/tracking.py's Tracker): what the trainer told it."""

    def __init__(self) -> None:
        self.tags: dict[str, str] = {}
        self.status: str | None = None

    def start(self, run_id, params, tags):
        return "run-1"

    def log_metrics(self, metrics, step):
        pass

    def set_tags(self, tags):
        self.tags.update(tags)

    def finish(self, status):
        self.status = status


class Events:
    def __init__(self) -> None:
        self.seen: list[dict] = []

    def emit(self, event: dict) -> None:
        self.seen.append(event)

    def close(self) -> None:
        pass


def test_weights_left_non_finite_by_the_last_step_are_neither_saved_nor_written_and_the_run_fails(
    prepared_data, folders
):
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    # 44 steps; the last one's loss stays finite, and only the weights its update leaves are not.
    arguments = [*train_arguments(prepared_data, folders.out, folders.checkpoints, nproc=1)[2:], *NO_TRACKING]
    config = config_from_args(
        parser.parse_args([*arguments, *diverging(44, "poison=gradient", epochs=1)]), {}, Path()
    )
    task = load_task(config.task, config.task_options)
    checkpointer = Checkpointer(LocalCheckpointStore(Path(config.checkpoints)), keep_last=2)
    tracker, events = RecordingTracker(), Events()
    trainer = Trainer(
        config, init_distributed("cpu", {}), task, task.load(config.data), checkpointer, tracker, events,
        launch_id="t", notice=PreemptionNotice(),
    )  # fmt: skip
    try:
        outcome = trainer.run()
    finally:
        checkpointer.close()

    assert (outcome.status, outcome.step, outcome.divergence.weights_only) == (DIVERGED, 44, True)
    assert outcome.divergence.message().startswith("training diverged at step 44: its update left weights")
    assert [event["step"] for event in events.seen if event["event"] == "diverged"] == [44]
    assert_stopped_cleanly(folders, newest_step=40)  # and no final checkpoint
    assert tracker.status == "FAILED" and tracker.tags == {"retrain.diverged_at_step": "44"}
