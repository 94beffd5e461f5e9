"""Planning maths for training runs: spot vs dedicated and the checkpoint interval (whose formulas are
core/spot.py), and GPU scaling (modelled, or fitted to measured step times).

Pure functions over frozen inputs. Inputs validate themselves, and their messages name the `retrain plan`
option that carries the value, so the command line can print them as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from core.errors import require

# The spot and interval formulas live in core/spot.py, which components/ uses too; `retrain plan`
# reaches them here, beside the scaling maths (the redundant aliases mark them as re-exported).
from core.spot import SECONDS_PER_HOUR, is_finite_number
from core.spot import IntervalAdvice as IntervalAdvice
from core.spot import IntervalInputs as IntervalInputs
from core.spot import SpotEstimate as SpotEstimate
from core.spot import SpotScenario as SpotScenario
from core.spot import checkpoint_interval as checkpoint_interval
from core.spot import spot_estimate as spot_estimate

DEFAULT_EFFICIENCY_THRESHOLD = 0.8


# -- scaling (modelled) ---------------------------------------------------------------------------------


def parse_gpu_counts(text: str) -> tuple[int, ...]:
    """`1,8,16` -> (1, 8, 16): positive whole numbers, increasing, so a typo cannot reorder the table."""
    expected = "--gpus must be increasing positive whole numbers without duplicates, e.g. 1,8,16"
    parts = [part.strip() for part in text.split(",")]
    require(all(part.isascii() and part.isdigit() for part in parts), f"{expected}; got {text!r}")
    counts = tuple(int(part) for part in parts)
    require(
        counts[0] >= 1 and all(a < b for a, b in pairwise(counts)),
        f"{expected}; got {text!r}",
    )
    return counts


@dataclass(frozen=True)
class ScalingInputs:
    single_gpu_hours: float
    comm_hours_per_doubling: float
    gpus: tuple[int, ...]
    efficiency_threshold: float = DEFAULT_EFFICIENCY_THRESHOLD
    gpu_hour_price: float | None = None
    value_per_hour_saved: float | None = None

    def __post_init__(self) -> None:
        require(
            is_finite_number(self.single_gpu_hours) and self.single_gpu_hours > 0,
            f"--single-gpu-hours must be a number of hours > 0, got {self.single_gpu_hours!r}",
        )
        require(
            is_finite_number(self.comm_hours_per_doubling) and self.comm_hours_per_doubling >= 0,
            f"--comm-hours-per-doubling must be a number of hours >= 0, got {self.comm_hours_per_doubling!r}",
        )
        check_scaling_options(
            self.gpus, self.efficiency_threshold, self.gpu_hour_price, self.value_per_hour_saved
        )


def check_scaling_options(
    gpus: tuple[int, ...],
    efficiency_threshold: float,
    gpu_hour_price: float | None,
    value_per_hour_saved: float | None,
) -> None:
    """The options both scaling modes share; measuring checks them before it spends minutes on runs."""
    require(
        len(gpus) > 0
        and all(isinstance(n, int) and n >= 1 for n in gpus)
        and all(a < b for a, b in pairwise(gpus)),
        f"--gpus must be increasing positive whole numbers without duplicates, got {gpus!r}",
    )
    require(
        is_finite_number(efficiency_threshold) and 0 < efficiency_threshold <= 1,
        f"--efficiency-threshold must be a fraction in (0, 1], got {efficiency_threshold!r}",
    )
    # The money test compares a cost with a value: one without the other cannot be weighed.
    require(
        (gpu_hour_price is None) == (value_per_hour_saved is None),
        "--gpu-hour-price and --value-per-hour-saved must be given together",
    )
    money = (("--gpu-hour-price", gpu_hour_price), ("--value-per-hour-saved", value_per_hour_saved))
    for flag, value in money:
        require(
            value is None or (is_finite_number(value) and value >= 0),
            f"{flag} must be a number >= 0, got {value!r}",
        )


@dataclass(frozen=True)
class ScalingRow:
    gpus: int
    wall_hours: float
    speedup: float
    efficiency: float
    gpu_hours: float


@dataclass(frozen=True)
class ScalingPlan:
    rows: tuple[ScalingRow, ...]
    recommended_gpus: int
    reason: str


def modelled_wall_hours(inputs: ScalingInputs, gpus: int) -> float:
    # Compute divides perfectly; each doubling of the ring adds a fixed communication cost.
    return inputs.single_gpu_hours / gpus + inputs.comm_hours_per_doubling * math.log2(gpus)


def scaling_plan(inputs: ScalingInputs) -> ScalingPlan:
    rows = []
    for gpus in inputs.gpus:
        wall = modelled_wall_hours(inputs, gpus)
        speedup = inputs.single_gpu_hours / wall
        rows.append(ScalingRow(gpus, wall, speedup, speedup / gpus, gpus * wall))
    recommended, reason = _recommend(inputs, rows)
    return ScalingPlan(tuple(rows), recommended, reason)


def _recommend(inputs: ScalingInputs, rows: list[ScalingRow]) -> tuple[int, str]:
    threshold = inputs.efficiency_threshold
    if len(rows) == 1 and rows[0].gpus == 1:
        return 1, "only one GPU given"
    efficient = [row for row in rows if row.efficiency >= threshold]
    if not efficient:
        return rows[0].gpus, f"no GPU count reaches efficiency {threshold:.2f}; the smallest given"
    best = efficient[0]
    priced = inputs.gpu_hour_price is not None and inputs.value_per_hour_saved is not None
    for row in efficient[1:]:
        # Each step up must buy back more in hours saved than it costs in extra GPU-hours.
        if priced and (
            inputs.gpu_hour_price * (row.gpu_hours - best.gpu_hours)
            >= inputs.value_per_hour_saved * (best.wall_hours - row.wall_hours)
        ):
            continue
        best = row
    reason = f"the largest GPU count with efficiency >= {threshold:.2f}"
    if priced:
        reason += " whose extra GPU-hours cost less than the value of the hours saved"
    return best.gpus, reason


# -- scaling (measured) ---------------------------------------------------------------------------------

# A reference run's length turns a step time into hours: long enough to be a real training job.
DEFAULT_RUN_STEPS = 100_000


@dataclass(frozen=True)
class StepTime:
    """The steady-state seconds per step measured on `processes` data-parallel processes."""

    processes: int
    seconds: float


@dataclass(frozen=True)
class StepFit:
    """step(N) = compute_seconds / N + comm_seconds_per_doubling · log2(N), fitted to measured steps.

    `clamped` says the unconstrained fit found a negative communication cost (noise: a step got faster
    than linear) and the fit was redone with none.
    """

    compute_seconds: float
    comm_seconds_per_doubling: float
    clamped: bool

    def step_seconds(self, processes: int) -> float:
        return self.compute_seconds / processes + self.comm_seconds_per_doubling * math.log2(processes)


@dataclass(frozen=True)
class MeasuredRow:
    processes: int
    step_seconds: float
    speedup: float
    efficiency: float
    fitted_step_seconds: float


def fit_step_times(points: Sequence[StepTime]) -> StepFit:
    """Least squares of step(N) = a/N + b·log2(N) over the points, with b >= 0 (exact for 2 points)."""
    for point in points:
        require(
            isinstance(point.processes, int) and point.processes >= 1,
            f"scaling fit: process counts must be whole numbers >= 1, got {point.processes!r}",
        )
        require(
            is_finite_number(point.seconds) and point.seconds > 0,
            f"scaling fit: step times must be seconds > 0, "
            f"got {point.seconds!r} at {point.processes} processes",
        )
    distinct = sorted({point.processes for point in points})
    require(
        len(distinct) >= 2,
        f"scaling fit: needs step times at 2 or more distinct process counts, got {distinct}",
    )
    # Normal equations of the two-column design [1/N, log2 N]; distinct N >= 1 keep the columns independent.
    u = [1 / point.processes for point in points]
    v = [math.log2(point.processes) for point in points]
    y = [point.seconds for point in points]
    uu, uv, vv = _dot(u, u), _dot(u, v), _dot(v, v)
    uy, vy = _dot(u, y), _dot(v, y)
    determinant = uu * vv - uv * uv
    a = (uy * vv - vy * uv) / determinant
    b = (vy * uu - uy * uv) / determinant
    clamped = b < 0
    if clamped:
        a, b = uy / uu, 0.0
    require(
        a > 0,
        f"scaling fit: step times grow faster with the process count than a/N + b·log2(N) allows "
        f"(fitted single-process step {a:.3g} s); measure a larger model or batch",
    )
    return StepFit(a, b, clamped)


def _dot(left: Sequence[float], right: Sequence[float]) -> float:
    return math.fsum(x * y for x, y in zip(left, right, strict=True))


def measured_rows(points: Sequence[StepTime], fit: StepFit) -> tuple[MeasuredRow, ...]:
    """Each point beside the fit; speedup against the measured 1-process step (the fitted one if absent)."""
    singles = [point.seconds for point in points if point.processes == 1]
    base = math.fsum(singles) / len(singles) if singles else fit.compute_seconds
    rows = []
    for point in points:
        speedup = base / point.seconds
        rows.append(
            MeasuredRow(
                point.processes,
                point.seconds,
                speedup,
                speedup / point.processes,
                fit.step_seconds(point.processes),
            )
        )
    return tuple(rows)


def check_run_steps(run_steps: int) -> None:
    require(
        isinstance(run_steps, int) and not isinstance(run_steps, bool) and run_steps >= 1,
        f"--run-steps must be a whole number >= 1, got {run_steps!r}",
    )


@dataclass(frozen=True)
class MeasuredScaling:
    """Measured steps, the fit, and the modelled plan for a run of `run_steps` steps at the fitted times."""

    measured: tuple[MeasuredRow, ...]
    fit: StepFit
    run_steps: int
    single_gpu_hours: float
    comm_hours_per_doubling: float
    plan: ScalingPlan


def measured_scaling(
    points: Sequence[StepTime],
    run_steps: int,
    gpus: tuple[int, ...],
    efficiency_threshold: float = DEFAULT_EFFICIENCY_THRESHOLD,
    gpu_hour_price: float | None = None,
    value_per_hour_saved: float | None = None,
) -> MeasuredScaling:
    """Fit the points, then plan as the modelled command would with T1 = a·R and k = b·R (in hours)."""
    check_run_steps(run_steps)
    fit = fit_step_times(points)
    inputs = ScalingInputs(
        single_gpu_hours=fit.compute_seconds * run_steps / SECONDS_PER_HOUR,
        comm_hours_per_doubling=fit.comm_seconds_per_doubling * run_steps / SECONDS_PER_HOUR,
        gpus=gpus,
        efficiency_threshold=efficiency_threshold,
        gpu_hour_price=gpu_hour_price,
        value_per_hour_saved=value_per_hour_saved,
    )
    return MeasuredScaling(
        measured_rows(points, fit),
        fit,
        run_steps,
        inputs.single_gpu_hours,
        inputs.comm_hours_per_doubling,
        scaling_plan(inputs),
    )
