"""The spot-vs-dedicated cost and the checkpoint interval: pure functions over frozen inputs, written once
for the planner (`retrain plan`), the trainer's interval and the front door's cost estimate
(components/cost.py). Standard library and core.errors only, like the rest of core/: the Function App
ships it too (.funcignore). Each message names the `retrain plan` option that carries the value."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

from core.errors import require

SECONDS_PER_HOUR = 3600.0


def is_finite_number(value: object) -> TypeGuard[int | float]:
    """A real, finite number; a bool is not one."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


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
        require(
            isinstance(self.gpus, int) and not isinstance(self.gpus, bool) and self.gpus >= 1,
            f"--gpus must be a whole number >= 1, got {self.gpus!r}",
        )
        require(
            is_finite_number(self.hours) and self.hours > 0,
            f"--hours must be a number > 0, got {self.hours!r}",
        )
        require(
            is_finite_number(self.evictions) and self.evictions >= 0,
            f"--evictions must be a number >= 0, got {self.evictions!r}",
        )
        # A discount of 1 makes spot free and every comparison meaningless, so it is refused.
        require(
            is_finite_number(self.discount) and 0 <= self.discount < 1,
            f"--discount must be a fraction in [0, 1), e.g. 0.6, got {self.discount!r}",
        )
        require(
            self.checkpoint_every is None
            or (is_finite_number(self.checkpoint_every) and self.checkpoint_every > 0),
            f"--checkpoint-every must be a number of hours > 0, got {self.checkpoint_every!r}",
        )
        require(
            is_finite_number(self.restart_overhead) and self.restart_overhead >= 0,
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


@dataclass(frozen=True)
class IntervalInputs:
    checkpoint_seconds: float
    mtbe_hours: float

    def __post_init__(self) -> None:
        require(
            is_finite_number(self.checkpoint_seconds) and self.checkpoint_seconds > 0,
            f"--checkpoint-seconds must be a number of seconds > 0, got {self.checkpoint_seconds!r}",
        )
        require(
            is_finite_number(self.mtbe_hours) and self.mtbe_hours > 0,
            f"--mtbe-hours must be a number of hours > 0, got {self.mtbe_hours!r}",
        )


@dataclass(frozen=True)
class IntervalAdvice:
    young_seconds: float
    daly_seconds: float
    overhead_fraction: float
    lost_seconds_per_eviction: float


def checkpoint_interval(inputs: IntervalInputs) -> IntervalAdvice:
    """Young's and Daly's optimal checkpoint intervals for a save of `checkpoint_seconds` and a mean time
    between evictions of `mtbe_hours`."""
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
