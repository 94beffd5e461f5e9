"""Each served model's gate policy against its task's metrics, checked at start-up, without torch.

A policy naming a metric its task does not report would pass every event and fail every run after its
training (on Azure ML, at register). A built-in task's metrics are static (core/metrics.py, which the
task classes read too), so start-up refuses such a model in one line naming it, the metric and the task's
metrics; and so an early-stopping metric (`validation_<metric>`) it does not report. A class's recall
(`recall_7`) is checked against the class count the model's options fix (the tabular task's n_classes or
classes); where only the data fixes it, the run's pre-run check reads it there. A user's task declares its
metrics in a file that needs torch to import: the flush checks it (function_app/task_check.py), once per
version of the file, before anything is spent; on Azure ML the pipeline's first step checks it again
before preparing data.

The policy checked is what a run submits: the model's [gate] with RETRAIN_PIPELINE_PARAMETERS over it. Its
confidence is checked against the resample count too, for every task (core/gate_rules.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from components.preflight import STOPPING_METRIC
from core.errors import InputError
from core.gate_rules import CONFIDENCE, RESAMPLES, resampling_conflict
from core.metrics import (
    BOUND_OPTIONS,
    MetricSet,
    builtin_class_count,
    builtin_declared,
    check_policy_metrics,
    configured_metrics,
)
from core.train_rules import OFF_WORDS, validation_metric
from function_app.settings.models import ModelRoute
from function_app.settings.storage import SettingsError

METRIC_PARTS = ("primary_metric", *BOUND_OPTIONS)  # the policy's parts that name metrics


def check_gate_policies(
    models: Iterable[ModelRoute], pipeline_parameters: Mapping[str, str], setting: str
) -> None:
    """Raise SettingsError for the first built-in-task model whose policy names a metric its task lacks;
    `pipeline_parameters` (the app setting `setting`) override each model's [gate], as in its runs."""
    for route in models:
        # Any task: a confidence its resample count can never support fails every run at register.
        merged = {**route.parameters, **pipeline_parameters}
        conflict = resampling_conflict(merged.get(CONFIDENCE), merged.get(RESAMPLES))
        if conflict is not None:
            given = " with " + setting if {CONFIDENCE, RESAMPLES} & set(pipeline_parameters) else ""
            raise SettingsError(f"model {route.name!r} ({route.source}{given}): {conflict}")
        declared = builtin_declared(route.task, route.task_options)
        if declared is None:
            continue  # a user's task: checked by the flush, once per version of its file
        parameters = {**route.parameters, **pipeline_parameters}
        source = f"{route.source} [gate]" if route.config is not None else "the gate policy"
        if any(name in pipeline_parameters for name in METRIC_PARTS):
            source += f" with {setting}"
        where = f"model {route.name!r} ({source}, task {route.task!r})"
        # With the class count its options fix (n_classes), a class's recall beyond it (recall_12 of 10)
        # is one the task never reports; where only the data fixes it, the run's pre-run check reads it.
        metrics = declared.metrics.with_class_count(builtin_class_count(route.task, route.task_options))
        try:
            check_policy_metrics(metrics, configured_metrics(parameters), where)
        except InputError as error:  # a metric it lacks, or a bound that does not parse
            message = str(error)
            raise SettingsError(message if message.startswith(where) else f"{where}: {message}") from None
        _check_stopping_metric(route, metrics, parameters.get(STOPPING_METRIC), pipeline_parameters, setting)


def _check_stopping_metric(
    route: ModelRoute,
    metrics: MetricSet,
    name: object,
    pipeline_parameters: Mapping[str, str],
    setting: str,
) -> None:
    """An early-stopping metric the built-in task does not report fails every run at its first validation:
    refused at start-up, as the pre-run check refuses it."""
    if not isinstance(name, str) or name.strip().lower() in ("", *OFF_WORDS):
        return
    source = f"{route.source} [pipeline]" if route.config is not None else "the pipeline parameters"
    if STOPPING_METRIC in pipeline_parameters:
        source = setting
    try:
        validation_metric(name.strip(), metrics, route.task)
    except InputError as error:
        raise SettingsError(
            f"model {route.name!r} ({source}): parameter {STOPPING_METRIC} is {name!r}: {error}"
        ) from None
