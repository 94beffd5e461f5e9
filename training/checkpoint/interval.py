"""`--checkpoint-every-seconds auto`: measure what a checkpoint costs this run, then save at Daly's interval.

Each attempt measures afresh (a resumed attempt may run on a node with other storage): it saves right
after its first step, so that an eviction in the first minutes loses almost nothing, and again as soon as
each save is durable, until `MEASURED_SAVES` saves after the warm-up one are measured. From then on it
saves at Daly's optimum for the measured cost and the configured mean time between evictions (the maths
is `retrain plan interval`'s, core/spot.py), never faster than a save can be written.

Which cost enters Young/Daly. Their C is the work a run loses per checkpoint. Our checkpoints are
asynchronous: the loop stops only while the state is planned and staged (`SaveResult.blocked_seconds`);
serialising and writing (`write_seconds`) go on in the background while training continues, at the lowest
CPU priority. So C is the blocked time. The write time does not enter C: it delays the moment a save is
durable, which adds the same W to the rework of every eviction (half an interval plus W), a constant that
does not move the optimum. It bounds the interval from below instead: a save started before the previous
one is durable waits for it inside the loop, turning background time back into blocked time.

Pure: no clock, no torch. The checkpoint manager (manager.py) feeds it the results of its saves and asks it
when to save.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from dataclasses import fields as dataclass_fields
from typing import Any

from core.errors import InputError
from core.spot import IntervalInputs, checkpoint_interval, is_finite_number
from training.engine.config import DEFAULT_CHECKPOINT_EVERY_SECONDS

# The first save of an attempt allocates the staging buffers (pinned host memory on a GPU node) and opens
# the store; later saves reuse both. It protects the first minutes but is not measured.
WARMUP_SAVES = 1
# Saves measured after the warm-up; the slowest counts, so one lucky save cannot shorten the interval.
MEASURED_SAVES = 2
# Storage throughput varies (Blob Storage most), and the writer shares the node with training: twice the
# measured write time keeps a slower-than-measured write from making the next save wait in the loop.
WRITE_HEADROOM = 2.0
# Below any real stall; keeps Daly's formula defined when a coarse clock measures a stall of zero.
SMALLEST_COST_SECONDS = 1e-6
# A store that keeps failing is not hammered with a save per step: after this many failed measuring saves
# the attempt falls back to the trainer's fixed default interval.
MAX_FAILED_SAVES = 3
FALLBACK_INTERVAL_SECONDS = DEFAULT_CHECKPOINT_EVERY_SECONDS

RULE_DALY = "daly"
RULE_WRITE_FLOOR = "write_floor"
RULE_FALLBACK = "fallback"


def _measured(value: object, what: str) -> float:
    if not is_finite_number(value) or value < 0:
        raise InputError(f"{what} {value!r}: expected a measured number of seconds >= 0")
    return float(value)


@dataclass(frozen=True)
class IntervalMeasurement:
    """What the measuring saves cost (the slowest of each), and Young's and Daly's intervals for that cost."""

    cost_seconds: float
    write_seconds: float
    young_seconds: float
    daly_seconds: float


# A fallback measured nothing that held: its event and metadata say so with nulls, under the same keys.
_UNMEASURED = dict.fromkeys(field.name for field in dataclass_fields(IntervalMeasurement))


@dataclass(frozen=True)
class IntervalChoice:
    """The interval an attempt saves at, the rule that chose it, and the measurement it was chosen from
    (None on the fallback, so a choice is either measured throughout or not at all)."""

    interval_seconds: float
    rule: str
    mtbe_hours: float
    measured: IntervalMeasurement | None = None
    measured_saves: int = 0
    failed_saves: int = 0

    def fields(self) -> dict[str, Any]:
        """JSON-ready and flat: the progress event's fields and the attempt's entry in metadata.json."""
        chosen = {name: value for name, value in vars(self).items() if name != "measured"}
        return {**chosen, **(asdict(self.measured) if self.measured else _UNMEASURED)}

    def metrics(self) -> dict[str, float]:
        """For experiment tracking. Metrics, not params: a resumed run continues the same MLflow run, whose
        params cannot change, and every attempt measures and chooses anew."""
        metrics = {"checkpoint_interval_seconds": self.interval_seconds}
        if self.measured is not None:
            metrics["checkpoint_cost_seconds"] = self.measured.cost_seconds
            metrics["checkpoint_measured_write_seconds"] = self.measured.write_seconds
        return metrics


def choose_interval(
    cost_seconds: float, write_seconds: float, mtbe_hours: float, measured_saves: int = 1
) -> IntervalChoice:
    """Daly's interval for a save that blocks training `cost_seconds` and writes in `write_seconds`,
    floored at `WRITE_HEADROOM` times the write."""
    cost = _measured(cost_seconds, "checkpoint cost")
    write = _measured(write_seconds, "checkpoint write time")
    advice = checkpoint_interval(IntervalInputs(max(cost, SMALLEST_COST_SECONDS), mtbe_hours))
    floor = WRITE_HEADROOM * write
    interval, rule = (
        (advice.daly_seconds, RULE_DALY) if advice.daly_seconds >= floor else (floor, RULE_WRITE_FLOOR)
    )
    measured = IntervalMeasurement(cost, write, advice.young_seconds, advice.daly_seconds)
    return IntervalChoice(interval, rule, mtbe_hours, measured, measured_saves)


class IntervalCalibration:
    """One attempt's measuring saves and the interval chosen from them.

    The trainer asks `wants_save()` at each step, calls `save_started()` when it begins an interval save,
    and hands each finished interval save to `observe()`, which returns the choice once it is made.
    """

    def __init__(
        self,
        mtbe_hours: float,
        warmup_saves: int = WARMUP_SAVES,
        measured_saves: int = MEASURED_SAVES,
        max_failed_saves: int = MAX_FAILED_SAVES,
    ) -> None:
        IntervalInputs(1.0, mtbe_hours)  # refuse a bad MTBE before the first save, not after the measurements
        if warmup_saves < 0 or measured_saves < 1 or max_failed_saves < 1:
            raise InputError(
                f"interval calibration {warmup_saves}/{measured_saves}/{max_failed_saves}: expected warm-up "
                "saves >= 0, measured saves >= 1 and allowed failures >= 1"
            )
        self._mtbe_hours = mtbe_hours
        self._warmup_left = warmup_saves
        self._wanted = measured_saves
        self._max_failed = max_failed_saves
        self._costs: list[float] = []
        self._writes: list[float] = []
        self._failed = 0
        self._in_flight = False
        self.choice: IntervalChoice | None = None

    @property
    def interval_seconds(self) -> float | None:
        """The chosen interval; None while measuring."""
        return self.choice.interval_seconds if self.choice else None

    def wants_save(self) -> bool:
        """Whether a measuring save should start now: still measuring, and no save of ours in flight (one
        that started before the previous was durable would measure the wait for it)."""
        return self.choice is None and not self._in_flight

    def save_started(self) -> None:
        if self.choice is None:
            self._in_flight = True

    def observe(self, blocked_seconds: float, write_seconds: float | None) -> IntervalChoice | None:
        """A finished interval save (`write_seconds` None: it failed). Returns the choice when this save
        completes the measurement, else None."""
        if self.choice is not None:
            return None
        self._in_flight = False
        if write_seconds is None:
            self._failed += 1
            if self._failed >= self._max_failed:
                self.choice = IntervalChoice(
                    FALLBACK_INTERVAL_SECONDS, RULE_FALLBACK, self._mtbe_hours, failed_saves=self._failed
                )
            return self.choice
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return None
        self._costs.append(_measured(blocked_seconds, "checkpoint cost"))
        self._writes.append(_measured(write_seconds, "checkpoint write time"))
        if len(self._costs) < self._wanted:
            return None
        choice = choose_interval(max(self._costs), max(self._writes), self._mtbe_hours, len(self._costs))
        self.choice = replace(choice, failed_saves=self._failed)
        return self.choice
