"""What a warm start imports ahead of the steps, by what needs it; and the importing.

A training worker needs torch's compiler stack (every optimizer's first parameter group imports it),
torchrun and the worker itself, and MLflow with its SQL stores when it tracks. The local run's starter
(server.py) imports all of it and what the other steps need besides; `retrain train`'s launcher
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


def load(name: str) -> None:
    """Import `name`; one that fails is left to fail where it is needed, and reported there."""
    try:
        importlib.import_module(name)
    except Exception as error:
        print(
            f"warm start: not preloaded {name}: {type(error).__name__}: {error}", file=sys.stderr, flush=True
        )


def preload(names: tuple[str, ...]) -> None:
    for name in names:
        load(name)
