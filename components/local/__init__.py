"""The local pipeline runner, the embedded default: the pipeline's steps as processes on this machine.

It executes the very `command:` lines of the component YAMLs, in dependency order, maps outputs to
folders under the state folder, reuses unchanged steps from an immutable cache, runs `distribution:
pytorch` steps under torchrun, and restarts a preempted training step so that it resumes.

The deployed Function App does not ship this package (.funcignore): the contract, the Azure ML twin and
function_app/ never import it (tests/test_architecture.py); RETRAIN_SUBMITTER=local reaches its submitter
by name, through components/submitters.py.

The names below are imported when first asked for, so that a module of this package (warm.py, which
`retrain run` imports to start its warm starter before anything else) costs only its own imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.local.options import RunnerOptions
    from components.local.runner import LocalRunner, LocalStepFailed
    from components.local.runs import RunRecord, RunStore, StepAttempt, StepRecord

_HOMES = {
    "LocalRunner": "components.local.runner",
    "LocalStepFailed": "components.local.runner",
    "RunRecord": "components.local.runs",
    "RunStore": "components.local.runs",
    "RunnerOptions": "components.local.options",
    "StepAttempt": "components.local.runs",
    "StepRecord": "components.local.runs",
}
__all__ = [
    "LocalRunner",
    "LocalStepFailed",
    "RunRecord",
    "RunStore",
    "RunnerOptions",
    "StepAttempt",
    "StepRecord",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
