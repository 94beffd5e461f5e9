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


def artifacts_beside(tracking_uri: str) -> str | None:
    """A SQLite store keeps its artifacts next to the database file, as the state folder does (MLflow's own
    default, ./mlruns, would land in whatever the working directory is); any other store decides itself."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    # sqlite:////abs/m.db names an absolute path, sqlite:///m.db one relative to the working directory.
    database = Path(tracking_uri.removeprefix("sqlite:///")).resolve()
    return (database.parent / "mlartifacts").as_uri()
