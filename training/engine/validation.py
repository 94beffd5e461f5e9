"""Validation while training: the validation split scored at the due steps, the best step, early stopping.

With `--validate-every-epochs N` and/or `--validate-every-steps N`, the trainer asks `after_step` after every
step it trains. At a due step (training/engine/early_stopping.py: the cadence, and the last step) rank 0
scores the whole validation split with the task's `score` (in eval mode, gradients off: outputs.scores) and
broadcasts the metrics; every rank folds the same metrics into the run's `ValidationState`, so all of them
reach the same early-stopping decision at the same step, whatever the world size. Rank 0 alone scores: the
result does not depend on how many ranks there are, and the other ranks' share of the work would be a
second, possibly different, floating-point sum. Under FSDP no rank holds the whole model, so every rank
scores the whole split through the sharded model (the same forward everywhere), and rank 0's result is
still the one broadcast; the best weights are then gathered whole into rank 0's CPU memory
(training/engine/strategy.py).

Each validation is logged to MLflow as `validation_<metric>` at its step and emitted as a `validation`
progress event. When the selection metric improves, rank 0 keeps a CPU copy of the weights: the best
candidate. The state and that copy are in every checkpoint (`RunState.validation`, `RunState.best_weights`),
never a checkpoint of their own, so keep-two eviction cannot lose the best, and a run killed at any point
resumes with the same best and the same count towards its patience.

The validation of a step happens before anything can save that step's state (an interval, eviction or final
checkpoint), so a checkpoint never holds a step whose due validation is still to come; `last_step` guards
against validating one step twice all the same.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from typing import Any, cast

from torch import nn

from core.errors import InputError
from core.train_rules import CANDIDATE_BEST, CANDIDATE_LAST, VALIDATION_PREFIX
from training.engine.batches import on_device
from training.engine.config import TrainConfig
from training.engine.distributed import DistContext, broadcast_from_primary
from training.engine.early_stopping import (
    STOP_COMPLETED,
    STOP_EARLY,
    SelectionRule,
    due,
    observe,
    selection_rule,
)
from training.engine.outputs import scores
from training.engine.strategy import Strategy
from training.engine.tracking import Tracker
from training.engine.train_state import RunState
from training.tasks.base import Task, TaskData, class_count_of

log = logging.getLogger(__name__)


def rule_for(config: TrainConfig, task: Task) -> SelectionRule:
    """The run's selection rule; refuses, in one line, an early-stopping metric the task does not declare,
    or a class's metric beyond the class count its options fix (`validation_recall_5` of 3 classes).
    The launcher asks it before any process starts, every worker before its first step."""
    return selection_rule(
        task.metrics.with_class_count(class_count_of(task, None)),
        task.name,
        task.default_primary_metric,
        config.early_stopping_metric,
        config.early_stopping_patience,
        config.early_stopping_min_delta,
    )


class Validator:
    """One attempt's validation, for the trainer that holds it; the state it updates is the run's."""

    def __init__(
        self,
        config: TrainConfig,
        context: DistContext,
        task: Task,
        data: TaskData,
        model: nn.Module,
        tracker: Tracker,
        emit: Callable[..., None],
        *,
        strategy: Strategy,
        steps_per_epoch: int,
        total_steps: int,
    ) -> None:
        self._config = config
        self._context = context
        self._task = task
        self._model = model
        self._tracker = tracker
        self._emit = emit
        self._strategy = strategy
        self._steps_per_epoch = steps_per_epoch
        self._total_steps = total_steps
        self.rule = rule_for(config, task)
        self.enabled = config.validates
        # Only the ranks that score move the split to the device.
        self._scores_here = context.is_primary or strategy.every_rank_scores
        scoring = self.enabled and self._scores_here
        self._split = on_device(data.split("validation"), context.device) if scoring else None

    def after_step(self, run: RunState) -> None:
        """Validate the state after `run.step` if it is due; every rank calls it after every step."""
        step = run.step
        if step <= run.validation.last_step or not due(
            step,
            total_steps=self._total_steps,
            steps_per_epoch=self._steps_per_epoch,
            every_epochs=self._config.validate_every_epochs,
            every_steps=self._config.validate_every_steps,
        ):
            return
        metrics = self._agreed_scores()
        if self.rule.metric not in metrics:
            missing = self.rule.metric.removeprefix(VALIDATION_PREFIX)
            if self._task.metrics.per_class_member(missing) is not None:
                # One class's metric: the split may lack that class, or the model have fewer classes.
                raise InputError(
                    f"--early-stopping-metric {self.rule.metric!r}: the validation split at step {step} "
                    f"gave no {missing!r} (a class it does not hold, or one the model does not have); "
                    "expected a metric every validation reports, such as validation_"
                    f"{self._task.default_primary_metric}"
                )
            raise InputError(
                f"task {self._task.name!r}: score() did not report {missing!r} on the validation split, "
                "which validation selects by; expected every metric it declares"
            )
        observation = observe(run.validation, self.rule, step, metrics)
        run.validation = observation.state
        if observation.improved:  # every rank alike: under FSDP the copy gathers every shard
            best = self._strategy.full_weights(self._model)
            if self._context.is_primary:
                run.best_weights = best
        self._report(run, metrics)

    def _agreed_scores(self) -> dict[str, float]:
        """Rank 0's scores of the validation split, on every rank (or its failure, raised on every rank)."""
        outcome: tuple[dict[str, float] | None, str | None] | None = None
        error: BaseException | None = None
        if self._scores_here:
            try:
                raw = scores(self._task, self._model, self._split)
                outcome = ({f"{VALIDATION_PREFIX}{name}": value for name, value in raw.items()}, None)
            except Exception as failure:  # every rank must hear of it, or the others wait at the broadcast
                error = failure
                outcome = (None, f"{type(failure).__name__}: {failure}")
        metrics, failure_text = cast(
            tuple[dict[str, float] | None, str | None], broadcast_from_primary(outcome, self._context)
        )
        if error is not None:
            raise error
        if metrics is None:
            raise RuntimeError(f"validation failed on rank 0 ({failure_text})")
        return metrics

    def _report(self, run: RunState, metrics: dict[str, float]) -> None:
        state = run.validation
        self._emit(
            "validation",
            step=run.step,
            metrics=metrics,
            metric=self.rule.metric,
            best_step=state.best_step,
            since_best=state.since_best,
            patience=self.rule.patience,
            stop=state.stopped_at is not None,
        )
        finite = {name: value for name, value in metrics.items() if math.isfinite(value)}
        self._tracker.log_metrics(finite, step=run.step)
        if state.stopped_at is not None:
            self._tracker.set_tags({"retrain.early_stopped_at_step": str(state.stopped_at)})

    # -- the end --------------------------------------------------------------------------------------

    def candidate(self, model: nn.Module, run: RunState) -> tuple[nn.Module, dict[str, Any]]:
        """The model to write to --out, and what metadata.json says of it and of the validations.

        With `best`, a copy of `model` holding the best validated weights; if no validation ever improved
        (every value not finite), the last weights, with a warning."""
        kind = self._config.candidate_kind
        state = run.validation
        chosen = model
        if kind == CANDIDATE_BEST:
            if run.best_weights is None:
                log.warning(
                    "no validation gave a finite %s: the model written is the last step's", self.rule.metric
                )
                kind = CANDIDATE_LAST
            else:
                chosen = copy.deepcopy(model)
                chosen.load_state_dict(run.best_weights)
        stopped = state.stopped_at is not None
        summary: dict[str, Any] = {
            "candidate": kind,
            "candidate_step": state.best_step if kind == CANDIDATE_BEST else run.step,
            "stop_reason": STOP_EARLY if stopped else STOP_COMPLETED,
            "stopped_at_step": run.step,
            "validation": None,
        }
        if self.enabled:
            summary["validation"] = {
                "every_epochs": self._config.validate_every_epochs,
                "every_steps": self._config.validate_every_steps,
                "metric": self.rule.metric,
                "direction": "higher" if self.rule.higher else "lower",
                "patience": self.rule.patience,
                "min_delta": self.rule.min_delta,
                "validations": state.validations,
                "best_step": state.best_step,
                "best_value": state.best_value,
                "best_metrics": dict(state.best_metrics),
                "validations_since_best": state.since_best,
            }
        return chosen, summary
