"""A run that overfits: few noisy training rows, a wide model without dropout, many epochs.

The digits with 30% of their labels changed, 10% of the rows for training (161), the rest for validation and
test: the validation loss falls for a few epochs, then rises as the model learns the noise, so early stopping
on it stops the run long before its last epoch. 161 rows / 4 = 40 steps an epoch; 30 epochs would be 1200
steps, the run stops after about 240.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from training.data.splits import SplitFractions
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.sample_data import write_sample_batches

STEPS_PER_EPOCH = 40
TOTAL_STEPS = 30 * STEPS_PER_EPOCH
OVERFITTING_RUN = [
    "--epochs", "30", "--global-batch-size", "4", "--learning-rate", "0.0005", "--warmup-steps", "0",
    "--task-option", "dropout=0", "--seed", "0", "--deterministic",
    "--checkpoint-every-steps", "10", "--checkpoint-every-seconds", "off",
    "--validate-every-epochs", "1", "--early-stopping-metric", "validation_loss",
    "--early-stopping-patience", "2",
]  # fmt: skip


def prepare_overfitting_data(root: Path) -> Path:
    """The noisy, mostly held-out digits as a prepared data version under `root`; returns its folder."""
    write_sample_batches(root / "raw", batches=1, label_noise=0.3)
    prepare(root / "raw", root / "prepared", split=SplitFractions(0.1, 0.45, 0.45))
    return root / "prepared"


def overfitting_arguments(
    data: Path, out: Path, checkpoints: Path, nproc: int, tracking: Sequence[str] = ("--no-mlflow",)
) -> list[str]:
    """`retrain train` arguments for the overfitting run; `tracking`: its MLflow flags (default: none)."""
    locations = ["--data", str(data), "--out", str(out), "--checkpoints", str(checkpoints)]
    return ["--nproc", str(nproc), *locations, *OVERFITTING_RUN, *tracking]
