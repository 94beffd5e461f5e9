"""The built-in tasks' metrics are declared once, torch-free (core/metrics.py), where the front door's
start-up check reads them: the task classes report exactly those declarations, and every built-in task has
one."""

from __future__ import annotations

import pytest

from components.task_ref import BUILTIN_RAW_SUFFIXES
from core.metrics import BUILTIN_TASK_METRICS, check_policy_metrics
from training.gate.policy import task_defaults
from training.tasks.loader import load_task


@pytest.mark.parametrize("name", sorted(BUILTIN_RAW_SUFFIXES))
def test_each_built_in_task_reports_the_metrics_the_front_door_checks_against(name):
    declared = BUILTIN_TASK_METRICS[name]
    task = load_task(name, {})
    assert task.metrics == declared.metrics
    assert task.default_primary_metric == declared.default_primary_metric
    # The policy a model gets with no [gate] passes the start-up check.
    defaults = task_defaults(declared.metrics, declared.default_primary_metric).describe()
    named = [("primary_metric", defaults["primary_metric"])]
    for part in ("floors", "max_regression", "first_model_floors"):
        bounds = defaults[part]
        named += [] if bounds == "none" else [(part, item.split("=")[0]) for item in bounds.split(",")]
    check_policy_metrics(declared.metrics, named)


def test_every_built_in_task_has_declared_metrics():
    assert set(BUILTIN_TASK_METRICS) == set(BUILTIN_RAW_SUFFIXES)
