"""The demo's scenario: its sizes, the settings a deployment would give the front door, and the data.

The digits data set is split in two: the first part lands as ordinary batches (with the overlaps a real
feed re-delivers), the rest arrives later shifted, brighter and moved right, as if a new scanner came
online. That second batch is what the drift check must catch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import InputError
from training.tasks.tabular.sample_data import (
    batch_file_name,
    batch_ranges,
    digits_table,
    with_shift,
    write_batch_file,
)

DIGITS_ROWS = 1797
LANDING_ACCOUNT, LANDING_CONTAINER, LANDING_PREFIX = "retraindemo", "landing", "incoming/"
# Passed through from the caller's environment: the user's own price makes the cost estimate theirs.
PASSED_THROUGH = ("RETRAIN_GPU_HOUR_PRICE", "RETRAIN_SPOT_DISCOUNT", "RETRAIN_MTBE_HOURS")


@dataclass(frozen=True)
class DemoSize:
    """How big the story is. The defaults fit about three minutes on two cores; tests use fewer epochs."""

    first_rows: int = 1200
    first_batches: int = 3
    epochs: int = 30
    global_batch_size: int = 32
    processes: int = 2
    shift: float = 0.5
    # The image chapter: a small CNN learns the four sample shapes well within this many epochs.
    images_per_class: int = 60
    image_epochs: int = 10

    def __post_init__(self) -> None:
        if not 100 <= self.first_rows <= DIGITS_ROWS - 100:
            raise InputError(f"first_rows {self.first_rows}: expected 100 to {DIGITS_ROWS - 100}")
        if not 1 <= self.first_batches <= 9:
            raise InputError(f"first_batches {self.first_batches}: expected 1 to 9")
        if self.epochs < 2 or self.processes < 1:
            raise InputError("epochs >= 2 and processes >= 1 are needed for the story")
        if self.global_batch_size % self.processes:
            raise InputError(
                f"global_batch_size {self.global_batch_size}: expected a multiple of processes "
                f"{self.processes}"
            )
        if self.images_per_class < 20 or self.image_epochs < 1:
            raise InputError(
                f"images_per_class {self.images_per_class}, image_epochs {self.image_epochs}: expected at "
                "least 20 images per class (every split needs some) and 1 epoch"
            )
        if not 0 < self.shift <= 1:
            raise InputError(f"shift {self.shift}: expected a strength in (0, 1]")


def demo_environ(home: Path, size: DemoSize, model_name: str, base: Mapping[str, str] | None = None) -> dict:
    """The process environment of a front door deployed for the demo, and of the steps it runs."""
    base = dict(os.environ if base is None else base)
    # The demo is self-contained: another store or another front door's settings must not leak in.
    environ = {
        key: value
        for key, value in base.items()
        if not key.startswith(("RETRAIN_", "MLFLOW_")) or key in PASSED_THROUGH
    }
    parameters = {
        "epochs": size.epochs,
        "global_batch_size": size.global_batch_size,
        "checkpoint_every_seconds": "auto",
    }
    environ.update(
        {
            "RETRAIN_SUBMITTER": "local",
            "RETRAIN_HOME": str(home),
            "RETRAIN_MODEL_NAME": model_name,
            "RETRAIN_BLOB_ACCOUNT": LANDING_ACCOUNT,
            "RETRAIN_BLOB_CONTAINER": LANDING_CONTAINER,
            "RETRAIN_BLOB_PREFIX": LANDING_PREFIX,
            "RETRAIN_LANDING_FOLDER": str(home / "landing"),
            # The story flushes the batch itself, as the timer would once the quiet period passed, and
            # its second run follows the first within seconds.
            "RETRAIN_COOLDOWN_SECONDS": "0",
            "RETRAIN_MAX_RUNS_PER_DAY": "10",
            "RETRAIN_PIPELINE_PARAMETERS": ",".join(f"{key}={value}" for key, value in parameters.items()),
            "RETRAIN_TRAIN_PROCESSES_PER_NODE": str(size.processes),
        }
    )
    return environ


def write_first_batches(landing: Path, size: DemoSize) -> list[Path]:
    """The first `first_rows` digits as `first_batches` raw CSV files, overlapping as a feed re-delivers."""
    table = digits_table().slice(0, size.first_rows)
    paths = []
    for number, rows in enumerate(batch_ranges(size.first_rows, size.first_batches), start=1):
        path = landing / batch_file_name(number, "csv")
        landing.mkdir(parents=True, exist_ok=True)
        write_batch_file(table.slice(rows.start, len(rows)), path)
        paths.append(path)
    return paths


def write_shifted_batch(landing: Path, arrivals: Path, size: DemoSize) -> Path:
    """The remaining digits, shifted, as the next batch: kept in `arrivals` (what the drift check reads as
    the newly arrived data) and uploaded to the landing folder."""
    table = with_shift(digits_table().slice(size.first_rows), size.shift)
    name = batch_file_name(size.first_batches + 1, "csv")
    arrivals.mkdir(parents=True, exist_ok=True)
    write_batch_file(table, arrivals / name)
    write_batch_file(table, landing / name)
    return landing / name
