"""The small run the training tests train: its size, and its `retrain train` arguments."""

from __future__ import annotations

from pathlib import Path

# A small model and two short epochs: 1421 training rows / 32 = 44 steps per epoch, 88 steps in all, room
# for two kills mid-interval and mid-epoch (checkpoints every 10 steps) and a restart.
STEPS_PER_EPOCH = 44
TOTAL_STEPS = 2 * STEPS_PER_EPOCH
SMALL_RUN = [
    "--epochs", "2", "--global-batch-size", "32", "--task-option", "hidden_width=64", "--seed", "7",
    "--checkpoint-every-steps", "10", "--checkpoint-every-seconds", "off", "--deterministic",
]  # fmt: skip
NO_TRACKING = ("--no-mlflow",)


def train_arguments(data: Path, out: Path, checkpoints: str | Path, nproc: int) -> list[str]:
    """`retrain train` arguments for the small run."""
    locations = ["--data", str(data), "--out", str(out), "--checkpoints", str(checkpoints)]
    return ["--nproc", str(nproc), *locations, *SMALL_RUN]
