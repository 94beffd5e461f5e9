"""The local state folder of the embedded default: one place for data, checkpoints, models and MLflow.

Default `.retrain/` under the working directory; `RETRAIN_HOME` moves it. Only command-line edges call
this; library code receives paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

STATE_DIR_VARIABLE = "RETRAIN_HOME"


def state_root(environ: Mapping[str, str], cwd: Path) -> Path:
    configured = environ.get(STATE_DIR_VARIABLE)
    return Path(configured).expanduser().resolve() if configured else (cwd / ".retrain").resolve()


def default_mlflow_tracking_uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


def default_mlflow_artifact_location(root: Path) -> str:
    return (root / "mlartifacts").as_uri()
