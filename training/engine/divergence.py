"""Training that diverged: a loss that is no longer a finite number stops the run, with its own exit code.

When the mean loss of a step (every rank's, as the step consensus agrees it) is NaN or infinite, or a
step's update leaves a weight that is, the model is lost from that step on: every rank stops at the same
step, nothing is saved after it (so the newest checkpoint is the last good one), no model or metadata is
written to `--out`, and the MLflow run ends FAILED. The worker exits with `DIVERGED_EXIT_CODE`, and so do
`retrain train` and the pipeline's train step, which never reaches evaluate or register.

Unlike a preemption (75) or a crash, running the same command again does not help: it resumes from the
last good checkpoint and, training being deterministic, diverges at the same step. The user changes
something first: a lower `--learning-rate`, or the data (an extreme value in a feature or target).

Nothing here imports torch: the launcher above torchrun reads the code without paying for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from core.errors import RetrainError
from training.engine.failure_report import report_to_launcher

# EX_DATAERR from sysexits.h: "the input data was incorrect in some way". Clear of 0 (completed), 1 (a
# crash; torchrun's own code for any failed worker), 2 (bad input, refused before training) and 75
# (preempted, EX_TEMPFAIL: retry as is). Divergence is found only by training, and a retry without a change
# fails the same way: the numbers the run was given (its data or its learning rate) cannot be trained.
DIVERGED_EXIT_CODE = 65


@dataclass(frozen=True)
class Divergence:
    """The first step found non-finite: its number (as the step events count), its mean loss, and whether
    the loss itself or only the weights its update left were not finite."""

    step: int
    loss: float
    weights_only: bool = False

    def message(self) -> str:
        what = (
            f"its update left weights that are not finite (loss {self.loss:.6g})"
            if self.weights_only
            else f"its loss is {self.loss}"
        )
        return (
            f"training diverged at step {self.step}: {what}; nothing was saved after it and no model "
            "written; try a lower --learning-rate, or check the data for extreme values"
        )


class TrainingDiverged(RetrainError):
    """Raised (with `Divergence.message()`) once every rank has stopped, by rank 0's worker or by the
    launcher above torchrun: the CLI prints the line and exits with the code."""

    exit_code = DIVERGED_EXIT_CODE


def is_finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def report_divergence_to_launcher(environ: Mapping[str, str], divergence: Divergence) -> None:
    """Tell torchrun (and whoever reads its error file) why this worker stopped; torchrun copies the first
    failed worker's report into its own error file, with that worker's exit code."""
    report_to_launcher(environ, divergence.message(), DIVERGED_EXIT_CODE)
