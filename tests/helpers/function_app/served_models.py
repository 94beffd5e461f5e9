"""Front doors that serve several models: a model's configuration file models/<name>.toml, and the app
settings that serve the models from that folder."""

from __future__ import annotations

from pathlib import Path

from helpers.function_app.front_door_settings import app_settings

TABULAR, IMAGE = 'ref = "tabular"', 'ref = "image"'


def write_model(folder: Path, name: str, task: str = TABULAR, trigger: str = "") -> Path:
    """A minimal configuration file models/<name>.toml: a task and a [trigger] table."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(f"[task]\n{task}\n\n[trigger]\n{trigger}\n")
    return path


def served_environ(home: Path, models: str, **overrides: str) -> dict[str, str]:
    """The corpus's app settings, serving `models` from home/models instead of RETRAIN_MODEL_NAME."""
    environ = app_settings(home, RETRAIN_MODELS=models, RETRAIN_MODELS_DIR=str(home / "models"), **overrides)
    for single in ("RETRAIN_MODEL_NAME", "RETRAIN_BLOB_PREFIX"):
        environ.pop(single)
    return environ
