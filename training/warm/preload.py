"""What a warm start imports ahead of the steps, by what needs it; and the importing.

A training worker needs torch's compiler stack (every optimizer's first parameter group imports it),
torchrun and the worker itself, and MLflow with its SQL stores when it tracks. The local run's starter
(starter.py) imports all of it and what the other steps need besides; `retrain train`'s launcher
(training/engine/launch.py), which has torch and the task loaded already, only what its workers need.
"""

from __future__ import annotations

import importlib
import sys

TRACKING = (
    "mlflow",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "sqlalchemy.dialects.sqlite",
    "training.mlflow_setup",
)
TRAINING = (
    "torch._dynamo",
    "torch.distributed.run",
    "training.engine.worker",
    "training.engine.torchrun_agent",
)


def worker_modules(tracking: bool) -> tuple[str, ...]:
    return (*TRACKING, *TRAINING) if tracking else TRAINING


# Caches a step would otherwise fill itself, as MODULE:FUNCTION: logging a model makes MLflow map every
# installed distribution to its modules (importlib_metadata.packages_distributions: about 1 s here) to
# check the model's requirements against them. The starter fills it once; the register step inherits it.
# The installed packages are the run's environment's, the same for the starter and its steps.
FILLED_CACHES = ("mlflow.utils.requirements_utils:_init_packages_to_modules_map",)


def load(name: str) -> None:
    """Import `name`, or for MODULE:FUNCTION import MODULE and call FUNCTION(); one that fails is left to
    fail where it is needed, and reported there."""
    module, _, function = name.partition(":")
    try:
        imported = importlib.import_module(module)
        if function:
            getattr(imported, function)()
    except Exception as error:
        print(
            f"warm start: not preloaded {name}: {type(error).__name__}: {error}", file=sys.stderr, flush=True
        )


def preload(names: tuple[str, ...]) -> None:
    for name in names:
        load(name)
