"""The image task survives losing the node: `retrain prepare --task image`, then `retrain train --task image
--nproc 2` (real torchrun, gloo, on CPU) on PNGs in class folders, SIGKILLed with its whole process tree
mid-epoch twice and restarted, ends with the weights of a run that was never interrupted.

Only what the trainer guarantees is asserted, never a timing: a checkpoint it reported durable survives the
kill; each restart resumes from the newest checkpoint committed when the tree died (whichever that was) and
goes on with the very next batch; and metadata.json counts the attempts as they happened.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.training.image_harness import isolated_environ, prepared_image_folder
from helpers.training.run_outputs import newest_record, read_metadata
from helpers.training.training_process import kill_process_tree, resumed_event
from helpers.training.warm_training import WarmStarts

from training.checkpoint.records import REASON_INTERVAL, CheckpointRecord
from training.engine.supervise import Event, TrainingProcess
from training.tasks.image.manifest import read_manifest, read_split
from training.tasks.image.sample_data import SHAPES

SIZE = 16
PER_CLASS = 40  # 160 PNGs; the split (a stable hash of each file's key) puts 128 in train
TRAIN_IMAGES = 128
GLOBAL_BATCH = 16
STEPS_PER_EPOCH = TRAIN_IMAGES // GLOBAL_BATCH  # 8
EPOCHS = 32
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH  # 256, about 12 ms each here
# Odd, and 8 * 33 > 256: no interval checkpoint falls on an epoch boundary, so every one is mid-epoch.
CHECKPOINT_EVERY = 33
# The kills need no timing either. The test reads rank 0's progress lines through a pipe shrunk to one page;
# once it is full, rank 0 blocks on its next line (and rank 1 at the next all-reduce). So when the test has
# read step s, rank 0 has trained at most MAX_LAG_STEPS further: the unread bytes (the pipe's 4 KiB, the
# reader's 8 KiB buffer) hold at most 79 step lines of at least MIN_STEP_LINE bytes, and a step is reported
# after the next one is trained. The second kill then lands by step 2 * CHECKPOINT_EVERY + 4 +
# 2 * MAX_LAG_STEPS = 234 at the latest (the first kill after step CHECKPOINT_EVERY + 2, the second after the
# restart's first save, one interval on), before the run can end.
PIPE_BYTES = 4096
MIN_STEP_LINE = 157  # checked on every line the test reads
MAX_LAG_STEPS = 82
SMALL_CNN = [
    "--task", "image", "--task-option", f"size={SIZE}", "--task-option", "width=8",
    "--epochs", str(EPOCHS), "--global-batch-size", str(GLOBAL_BATCH), "--seed", "11",
    "--checkpoint-every-steps", str(CHECKPOINT_EVERY), "--checkpoint-every-seconds", "off", "--deterministic",
    "--no-mlflow",
]  # fmt: skip


@pytest.fixture(scope="module")
def image_data(tmp_path_factory: pytest.TempPathFactory, warm_starts: WarmStarts) -> Path:
    root = tmp_path_factory.mktemp("image-data")
    environ = isolated_environ(root / "home")
    _, prepared = prepared_image_folder(
        warm_starts, root, per_class=PER_CLASS, seed=0, side=SIZE, size=SIZE, environ=environ
    )
    # The step arithmetic above is planned around this split.
    assert len(read_split(prepared, read_manifest(prepared), "train").keys) == TRAIN_IMAGES
    return prepared


class Runs:
    """`retrain train` attempts on one checkpoint folder and one --out; leftovers die with the test."""

    def __init__(self, data: Path, root: Path, starts: WarmStarts) -> None:
        self.data, self.root, self.starts = data, root, starts
        self.out, self.checkpoints = root / "out", root / "checkpoints"
        self.started: list[TrainingProcess] = []
        self.logs: list[Path] = []

    def start(self) -> TrainingProcess:
        self.logs.append(self.root / f"attempt-{len(self.logs) + 1}.log")
        locations = ["--data", str(self.data), "--out", str(self.out), "--checkpoints", str(self.checkpoints)]
        with self.logs[-1].open("w") as log:  # the child writes to its own copy of the descriptor
            process = self.starts.training(
                ["--nproc", "2", *locations, *SMALL_CNN],
                env=isolated_environ(self.root / "home"),
                stderr=log,
                pipe_bytes=PIPE_BYTES,
            )
        self.started.append(process)
        return process

    def log_tail(self) -> str:
        return self.logs[-1].read_text()[-3000:]

    def stop_leftovers(self) -> None:
        for process in self.started:
            if process.process.poll() is None:
                kill_process_tree(process)
            process.stdout.close()


@pytest.fixture
def runs(image_data: Path, tmp_path: Path, warm_starts: WarmStarts) -> Iterator[Runs]:
    runs = Runs(image_data, tmp_path, warm_starts)
    yield runs
    runs.stop_leftovers()


@pytest.fixture(scope="module")
def uninterrupted(
    image_data: Path, tmp_path_factory: pytest.TempPathFactory, warm_starts: WarmStarts
) -> dict:
    runs = Runs(image_data, tmp_path_factory.mktemp("uninterrupted"), warm_starts)
    try:
        assert runs.start().finish() == 0, runs.log_tail()
    finally:
        runs.stop_leftovers()
    metadata = read_metadata(runs.out)
    assert metadata["steps"] == TOTAL_STEPS and metadata["resumes"] == 0
    return metadata


def is_durable_interval_checkpoint(event: Event) -> bool:
    return event["event"] == "checkpoint" and event["reason"] == REASON_INTERVAL


def is_mid_epoch_step_after(step: int):
    return lambda event: event["event"] == "step" and event["step"] > step and event["position"] > 0


def next_cursor(record: CheckpointRecord) -> tuple[int, int]:
    """(epoch, position) after the batch that follows `record`: no batch replayed, none skipped."""
    position = record.position + GLOBAL_BATCH
    return (record.epoch + 1, 0) if position + GLOBAL_BATCH > TRAIN_IMAGES else (record.epoch, position)


def first_step(process: TrainingProcess) -> Event:
    return next(event for event in process.events_seen if event["event"] == "step")


def test_the_kills_land_before_the_run_can_end_and_every_interval_checkpoint_is_mid_epoch():
    assert 2 * CHECKPOINT_EVERY + 4 + 2 * MAX_LAG_STEPS < TOTAL_STEPS
    assert all(step % STEPS_PER_EPOCH for step in range(CHECKPOINT_EVERY, TOTAL_STEPS, CHECKPOINT_EVERY))


def test_the_prepared_version_is_the_png_folder_at_the_configured_size(image_data):
    manifest = read_manifest(image_data)
    assert manifest.size == (SIZE, SIZE) and list(manifest.classes) == sorted(SHAPES)


def test_sigkill_of_the_whole_tree_twice_mid_epoch_then_a_restart_ends_with_the_uninterrupted_weights(
    uninterrupted, runs
):
    durable: list[CheckpointRecord] = []  # the checkpoint each restart must resume from
    attempts: list[TrainingProcess] = []
    for _ in range(2):
        process = runs.start()
        attempts.append(process)
        reported = process.wait_for(is_durable_interval_checkpoint)
        process.wait_for(is_mid_epoch_step_after(reported["step"]))
        kill_process_tree(process)  # the launcher, torchrun and both workers, each in its own session
        lines = [json.dumps(event) + "\n" for event in process.events_seen if event["event"] == "step"]
        assert min(len(line.encode()) for line in lines) >= MIN_STEP_LINE

        assert not (runs.out / "metadata.json").exists(), runs.log_tail()
        newest = newest_record(str(runs.checkpoints))  # whichever save had committed when the tree died
        assert newest.step >= reported["step"], "a checkpoint reported durable was lost"
        assert newest.reason == REASON_INTERVAL and newest.position > 0 and newest.step < TOTAL_STEPS
        assert newest.attempt == len(attempts)
        durable.append(newest)
    final = runs.start()
    attempts.append(final)
    assert final.finish() == 0, runs.log_tail()

    for record, restart in zip(durable, attempts[1:], strict=True):
        resumed = resumed_event(restart)
        assert (resumed["checkpoint"], resumed["step"], resumed["epoch"], resumed["position"]) == (
            record.name, record.step, record.epoch, record.position,
        )  # fmt: skip
        step = first_step(restart)
        assert (step["step"], step["epoch"], step["position"]) == (record.step + 1, *next_cursor(record))
    assert durable[0].step < durable[1].step

    metadata = read_metadata(runs.out)
    assert metadata["weights_sha256"] == uninterrupted["weights_sha256"]
    assert metadata["steps"] == TOTAL_STEPS and metadata["world_size"] == 2
    assert metadata["resumes"] == 2 and metadata["evictions_survived"] == 2
    history = metadata["attempts"]
    assert [attempt["ended"] for attempt in history] == ["interrupted", "interrupted", "completed"]
    assert [attempt["resumed_from"] for attempt in history] == [None, *(record.name for record in durable)]
    assert [attempt["started_at_step"] for attempt in history] == [0, *(record.step for record in durable)]
    assert [attempt["launch_id"] for attempt in history[:2]] == [record.launch_id for record in durable]
    assert metadata["task"]["name"] == "image"
    assert metadata["info"]["size"] == [SIZE, SIZE] and metadata["info"]["classes"] == sorted(SHAPES)
