"""`retrain run` with the built-in image task, end to end: prep -> train -> evaluate -> register.

The image model, configured by the repository's models/shapes.toml, registers a champion that
`mlflow.pyfunc` serves on a uint8 N×H×W×3 array. (A user's own task through `retrain run`:
test_readme_task.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from run_harness import QUICK, retrain_run

from components.model_config import MODELS_DIR_VARIABLE
from components.specs import REPO_ROOT


def test_an_image_model_registers_a_champion_that_serves_uint8_images(tmp_path):
    from PIL import Image

    from training.tasks.image.sample_data import write_sample_images

    raw = tmp_path / "raw"
    write_sample_images(raw, per_class=60, seed=0)
    state = tmp_path / "state"

    record, registration = retrain_run(
        state, REPO_ROOT / "models", "--task", "image", "--model-name", "shapes", "--data", str(raw),
        "--task-option", "width=16", "--epochs", "10", "--param", "global_batch_size=32", *QUICK,
    )  # fmt: skip

    assert record.model_name == "shapes"
    assert (registration["decision"]["accepted"], registration["registered_version"]) == (True, "1")
    commands = {step.name: step.command for step in record.steps}
    assert commands["train"][commands["train"].index("--task") + 1] == "image"

    import mlflow

    from training.gate.registry import resolve_store

    store = resolve_store(None, {}, state)
    mlflow.set_tracking_uri(store.tracking_uri)
    mlflow.set_registry_uri(store.tracking_uri)
    model = mlflow.pyfunc.load_model("models:/shapes@champion")
    files = sorted(raw.glob("*/*.png"))[::15]
    images = np.stack([np.asarray(Image.open(path).convert("RGB").resize((32, 32))) for path in files])
    assert images.dtype == np.uint8 and images.shape == (len(files), 32, 32, 3)
    answers = list(model.predict(images))
    assert len(answers) == len(files) and set(answers) <= {path.parent.name for path in files}
    right = sum(answer == path.parent.name for answer, path in zip(answers, files, strict=True))
    assert right >= len(files) // 2


@pytest.fixture(autouse=True)
def _no_stray_configuration(monkeypatch):
    """Each run here names its configuration folder; the working folder's must not matter."""
    monkeypatch.delenv(MODELS_DIR_VARIABLE, raising=False)
