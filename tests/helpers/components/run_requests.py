"""Run requests as the local runner's tests make them: data pinned as `retrain run` pins it, and the fields
of a small, fast training of the tabular task."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from components.data_version import snapshot_folder
from components.request import DataRef, RunRequest

# A small, fast training: 1421 rows / 32 = 44 steps per epoch; a checkpoint every 10 steps.
SMALL_TRAINING: dict[str, Any] = {
    "epochs": 2,
    "global_batch_size": 32,
    "checkpoint_every_steps": 10,
    "checkpoint_every_seconds": "off",
    "mlflow_tracking_uri": "off",
}
# ...of a small model: the tabular task's options.
SMALL_MODEL: dict[str, Any] = {"hidden_width": 64}


def pinned_request(
    state_root: Path, raw: Path, model_name: str = "digits", **request_fields: Any
) -> RunRequest:
    """A run request for `raw`, pinned as `retrain run` pins it: a snapshot under the state folder."""
    manifest, folder = snapshot_folder(raw, state_root / "data" / model_name)
    return RunRequest(model_name=model_name, data=DataRef(manifest.version, str(folder)), **request_fields)


def copy_raw(raw: Path, destination: Path) -> Path:
    shutil.copytree(raw, destination)
    return destination
