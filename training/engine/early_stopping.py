"""Validation's decisions, as pure functions: when to validate, what counts as better, when to stop.

The trainer (through training/engine/validation.py) scores the validation split at the steps `due` names,
and folds each result into a `ValidationState` with `observe`. Every rank folds the same metrics (rank 0's,
broadcast), so every rank reaches the same decision at the same step. The state is plain JSON values and is
part of every checkpoint (training/engine/train_state.py), so a resumed run continues the same count of
validations without improvement and the same best, and stops where an uninterrupted one would.

Torch-free: the rules are tested as the functions they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from core.errors import InputError
from core.metrics import MetricSet
from core.train_rules import VALIDATION_PREFIX, validation_metric

STOP_COMPLETED = "completed"  # every step of every epoch was trained
STOP_EARLY = "early_stopping"  # the early-stopping metric stopped improving


def due(
    step: int,
    *,
    total_steps: int,
    steps_per_epoch: int,
    every_epochs: int | None,
    every_steps: int | None,
) -> bool:
    """Whether the state after `step` is validated: every `every_steps` steps, at the end of every
    `every_epochs`-th epoch (either, when both are set), and at the last step, so that the last weights are
    a candidate too. Never without either."""
    if every_epochs is None and every_steps is None:
        return False
    if step == total_steps:
        return True
    by_steps = every_steps is not None and step % every_steps == 0
    by_epochs = every_epochs is not None and step % (every_epochs * steps_per_epoch) == 0
    return by_steps or by_epochs


@dataclass(frozen=True)
class SelectionRule:
    """What makes one validation better than another, and when a run stops for want of one.

    `metric` is named as the trainer logs it (`validation_loss`); `higher` is its task's direction;
    `patience` is None when the rule only picks the best (no early stopping)."""

    metric: str
    higher: bool
    patience: int | None
    min_delta: float = 0.0

    def improves(self, value: float, best: float | None) -> bool:
        """Whether `value` beats `best` by more than `min_delta`; a value that is not finite never does,
        and the first finite value always does."""
        if not math.isfinite(value):
            return False
        if best is None:
            return True
        return value > best + self.min_delta if self.higher else value < best - self.min_delta


def selection_rule(
    metrics: MetricSet,
    task_name: str,
    default_primary_metric: str,
    early_stopping_metric: str | None,
    patience: int,
    min_delta: float,
) -> SelectionRule:
    """The rule a run validates by: the early-stopping metric's, else the task's default primary metric's
    (which then only picks the best step). A metric the task does not declare is refused in one line."""
    if early_stopping_metric is None:
        metric = metrics.find(default_primary_metric)
        if metric is None:
            raise InputError(
                f"task {task_name!r}: its default_primary_metric {default_primary_metric!r} is not among its "
                "metrics; expected one of them"
            )
        return SelectionRule(VALIDATION_PREFIX + default_primary_metric, metric.direction == "higher", None)
    try:
        metric = validation_metric(early_stopping_metric, metrics, task_name)
    except InputError as error:
        raise InputError(f"--early-stopping-metric {early_stopping_metric}: {error}") from None
    return SelectionRule(early_stopping_metric, metric.direction == "higher", patience, min_delta)


@dataclass(frozen=True)
class ValidationState:
    """What a run knows of its validations so far; in every checkpoint, as `to_dict()`."""

    validations: int = 0
    last_step: int = 0  # the last step validated (0: none)
    best_step: int | None = None
    best_value: float | None = None
    best_metrics: Mapping[str, float] = field(default_factory=dict)
    since_best: int = 0  # validations after the best one, none of which improved on it by min_delta
    stopped_at: int | None = None  # the step early stopping stopped the run after

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "best_metrics": dict(self.best_metrics)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ValidationState:
        known = {name: values[name] for name in cls.__dataclass_fields__ if name in values}
        return cls(**known)


@dataclass(frozen=True)
class Observation:
    """A validation folded in: the new state, and whether this step became the best."""

    state: ValidationState
    improved: bool


def observe(
    state: ValidationState, rule: SelectionRule, step: int, metrics: Mapping[str, float]
) -> Observation:
    """`state` after validating `step` with `metrics` (named as logged: `validation_loss`)."""
    value = metrics[rule.metric]
    improved = rule.improves(value, state.best_value)
    validations = state.validations + 1
    if improved:
        new = replace(
            state,
            validations=validations,
            last_step=step,
            best_step=step,
            best_value=value,
            best_metrics=dict(metrics),
            since_best=0,
        )
        return Observation(new, True)
    since_best = state.since_best + 1
    stop = rule.patience is not None and since_best >= rule.patience
    new = replace(
        state,
        validations=validations,
        last_step=step,
        since_best=since_best,
        stopped_at=step if stop else None,
    )
    return Observation(new, False)
