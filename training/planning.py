"""Planning maths for training runs: spot vs dedicated, checkpoint interval, GPU scaling (modelled).

Pure functions over frozen inputs. Inputs validate themselves, and their messages name the `retrain plan`
option that carries the value, so the command line can print them as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from training.errors import InputError

SECONDS_PER_HOUR = 3600.0
DEFAULT_EFFICIENCY_THRESHOLD = 0.8


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InputError(message)


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# -- spot vs dedicated ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpotScenario:
    """A run of `hours` on `gpus` GPUs, evicted `evictions` times (an expectation: may be fractional)."""

    gpus: int
    hours: float
    evictions: float
    discount: float
    checkpoint_every: float | None = None
    restart_overhead: float = 0.0

    def __post_init__(self) -> None:
        _require(
            isinstance(self.gpus, int) and not isinstance(self.gpus, bool) and self.gpus >= 1,
            f"--gpus must be a whole number >= 1, got {self.gpus!r}",
        )
        _require(_finite(self.hours) and self.hours > 0, f"--hours must be a number > 0, got {self.hours!r}")
        _require(
            _finite(self.evictions) and self.evictions >= 0,
            f"--evictions must be a number >= 0, got {self.evictions!r}",
        )
        # A discount of 1 makes spot free and every comparison meaningless, so it is refused.
        _require(
            _finite(self.discount) and 0 <= self.discount < 1,
            f"--discount must be a fraction in [0, 1), e.g. 0.6, got {self.discount!r}",
        )
        _require(
            self.checkpoint_every is None or (_finite(self.checkpoint_every) and self.checkpoint_every > 0),
            f"--checkpoint-every must be a number of hours > 0, got {self.checkpoint_every!r}",
        )
        _require(
            _finite(self.restart_overhead) and self.restart_overhead >= 0,
            f"--restart-overhead must be a number of hours >= 0, got {self.restart_overhead!r}",
        )


@dataclass(frozen=True)
class SpotEstimate:
    wall_hours: float
    gpu_hours: float
    dedicated_gpu_hours: float
    cost_vs_dedicated: float
    lost_hours: float
    verdict: str


def spot_estimate(scenario: SpotScenario) -> SpotEstimate:
    # Evictions land uniformly between saves, so each loses half a save period; an interval longer than
    # the run never fires, which is the same as not checkpointing (the period is then the whole run).
    period = (
        scenario.hours
        if scenario.checkpoint_every is None
        else min(scenario.checkpoint_every, scenario.hours)
    )
    lost_per_eviction = period / 2
    lost_hours = scenario.evictions * lost_per_eviction
    wall_hours = scenario.hours + scenario.evictions * (lost_per_eviction + scenario.restart_overhead)
    gpu_hours = scenario.gpus * wall_hours
    dedicated = scenario.gpus * scenario.hours
    ratio = (1 - scenario.discount) * gpu_hours / dedicated
    return SpotEstimate(wall_hours, gpu_hours, dedicated, ratio, lost_hours, _verdict(ratio))


def _verdict(ratio: float) -> str:
    if math.isclose(ratio, 1.0, abs_tol=1e-9):
        return "break-even: spot costs the same as dedicated"
    if ratio < 1:
        return f"spot pays: {(1 - ratio) * 100:.0f}% cheaper than dedicated"
    return f"dedicated pays: spot costs {(ratio - 1) * 100:.0f}% more"


# -- checkpoint interval --------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntervalInputs:
    checkpoint_seconds: float
    mtbe_hours: float

    def __post_init__(self) -> None:
        _require(
            _finite(self.checkpoint_seconds) and self.checkpoint_seconds > 0,
            f"--checkpoint-seconds must be a number of seconds > 0, got {self.checkpoint_seconds!r}",
        )
        _require(
            _finite(self.mtbe_hours) and self.mtbe_hours > 0,
            f"--mtbe-hours must be a number of hours > 0, got {self.mtbe_hours!r}",
        )


@dataclass(frozen=True)
class IntervalAdvice:
    young_seconds: float
    daly_seconds: float
    overhead_fraction: float
    lost_seconds_per_eviction: float


def checkpoint_interval(inputs: IntervalInputs) -> IntervalAdvice:
    cost = inputs.checkpoint_seconds
    mtbe = inputs.mtbe_hours * SECONDS_PER_HOUR  # both formulas need one unit
    young = math.sqrt(2 * cost * mtbe)
    if cost < 2 * mtbe:
        ratio = cost / (2 * mtbe)
        daly = young * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost
    else:
        daly = mtbe  # Daly 2006: once a save costs this much, checkpoint once per expected eviction
    # Overhead and rework are reported at the recommended (Daly) interval, by the first-order model.
    overhead = cost / daly + daly / (2 * mtbe)
    return IntervalAdvice(young, daly, overhead, daly / 2)


# -- scaling (modelled) ---------------------------------------------------------------------------------


def parse_gpu_counts(text: str) -> tuple[int, ...]:
    """`1,8,16` -> (1, 8, 16): positive whole numbers, increasing, so a typo cannot reorder the table."""
    expected = "--gpus must be increasing positive whole numbers without duplicates, e.g. 1,8,16"
    parts = [part.strip() for part in text.split(",")]
    _require(all(part.isascii() and part.isdigit() for part in parts), f"{expected}; got {text!r}")
    counts = tuple(int(part) for part in parts)
    _require(
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
        _require(
            _finite(self.single_gpu_hours) and self.single_gpu_hours > 0,
            f"--single-gpu-hours must be a number of hours > 0, got {self.single_gpu_hours!r}",
        )
        _require(
            _finite(self.comm_hours_per_doubling) and self.comm_hours_per_doubling >= 0,
            f"--comm-hours-per-doubling must be a number of hours >= 0, got {self.comm_hours_per_doubling!r}",
        )
        _require(
            len(self.gpus) > 0
            and all(isinstance(n, int) and n >= 1 for n in self.gpus)
            and all(a < b for a, b in pairwise(self.gpus)),
            f"--gpus must be increasing positive whole numbers without duplicates, got {self.gpus!r}",
        )
        _require(
            _finite(self.efficiency_threshold) and 0 < self.efficiency_threshold <= 1,
            f"--efficiency-threshold must be a fraction in (0, 1], got {self.efficiency_threshold!r}",
        )
        # The money test compares a cost with a value: one without the other cannot be weighed.
        _require(
            (self.gpu_hour_price is None) == (self.value_per_hour_saved is None),
            "--gpu-hour-price and --value-per-hour-saved must be given together",
        )
        for flag, value in (
            ("--gpu-hour-price", self.gpu_hour_price),
            ("--value-per-hour-saved", self.value_per_hour_saved),
        ):
            _require(
                value is None or (_finite(value) and value >= 0),
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
