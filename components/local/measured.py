"""What the model's last training on this machine took, for `retrain run`'s cost estimate.

The newest run of the model whose train step ran to completion (a reused step names the run that trained
it, found further back) left a metadata.json in its model output: its optimizer steps, its epochs, its
processes and its training's wall time, earlier attempts and saves included (training/engine/trainer.py).
A training that cannot be read, or a step whose output is gone, is passed over: a measurement only ever
improves an estimate, it never stops a run. components/ never imports training/: this reads the file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.cost import CostSettingsError, MeasuredTraining
from components.local.resumes import METADATA_FILE, TRAINING_FORMAT
from components.local.runs import RunStore
from components.request import COMPLETED

log = logging.getLogger(__name__)

TRAIN_STEP, MODEL_OUTPUT = "train", "model"


def measured_training(store: RunStore, model_name: str) -> MeasuredTraining | None:
    """The newest completed, not reused, train step of `model_name` in `store` that says what it took."""
    for record in store.list():
        if record.model_name != model_name:
            continue
        step = next((step for step in record.steps if step.name == TRAIN_STEP), None)
        if step is None or step.status != COMPLETED or step.reused or MODEL_OUTPUT not in step.outputs:
            continue
        measured = _from_metadata(record.run_id, Path(step.outputs[MODEL_OUTPUT]) / METADATA_FILE)
        if measured is not None:
            return measured
    return None


def _from_metadata(run_id: str, path: Path) -> MeasuredTraining | None:
    try:
        metadata: Any = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        log.debug("no measured training in %s: %s", path, error)
        return None
    if not isinstance(metadata, Mapping) or metadata.get("format") != TRAINING_FORMAT:
        return None
    steps, epochs = metadata.get("steps"), metadata.get("epochs")
    try:
        return MeasuredTraining(
            run_id=run_id,
            seconds_per_step=float(metadata["wall_time_seconds"]) / steps,
            steps_per_epoch=steps / epochs,
            world_size=metadata["world_size"],
        )
    except (KeyError, TypeError, ZeroDivisionError, ValueError, CostSettingsError) as error:
        log.warning("run %s: %s does not say what its training took (%s); passed over", run_id, path, error)
        return None
