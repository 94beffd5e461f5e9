"""Each served model's gate policy against its task's metrics, checked at start-up, without torch.

A policy naming a metric its task does not report would pass every event and fail every run after its
training (on Azure ML, at register). A built-in task's metrics are static (core/metrics.py, which the
task classes read too), so start-up refuses such a model in one line naming it, the metric and the task's
metrics. A user's task declares its metrics in a file that needs torch to import: the flush checks it
(function_app/task_check.py), once per version of the file, before anything is spent; on Azure ML the
pipeline's first step checks it again before preparing data.

The policy checked is what a run submits: the model's [gate] with RETRAIN_PIPELINE_PARAMETERS over it. Its
confidence is checked against the resample count too, for every task (core/gate_rules.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from core.errors import InputError
from core.metrics import BOUND_OPTIONS, BUILTIN_TASK_METRICS, check_policy_metrics, configured_metrics
from core.gate_rules import CONFIDENCE, RESAMPLES, resampling_conflict
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
        declared = BUILTIN_TASK_METRICS.get(route.task)
        if declared is None:
            continue  # a user's task: checked by the flush, once per version of its file
        parameters = {**route.parameters, **pipeline_parameters}
        source = f"{route.source} [gate]" if route.config is not None else "the gate policy"
        if any(name in pipeline_parameters for name in METRIC_PARTS):
            source += f" with {setting}"
        where = f"model {route.name!r} ({source}, task {route.task!r})"
        try:
            check_policy_metrics(declared.metrics, configured_metrics(parameters), where)
        except InputError as error:  # a metric it lacks, or a bound that does not parse
            message = str(error)
            raise SettingsError(message if message.startswith(where) else f"{where}: {message}") from None
