"""`retrain run` with other tasks than the digits, end to end: prep -> train -> evaluate -> register.

- the built-in image task, configured by the repository's models/shapes.toml, registers a champion that
  `mlflow.pyfunc` serves on a uint8 N×H×W×3 array;
- a user's regression task (the one `retrain init --task custom` writes, mse lower is better) registers a
  champion, and the gate reads the direction: a worse candidate is refused, a better one promoted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from components import cli_local
from components.local import RunRecord, RunStore
from components.model_config import MODELS_DIR_VARIABLE
from components.model_init import init_model
from components.request import COMPLETED
from components.specs import REPO_ROOT

QUICK = ["--param", "checkpoint_every_seconds=off", "--param", "mlflow_tracking_uri=off"]


def retrain_run(state: Path, models: Path, *argv: str) -> tuple[RunRecord, dict]:
    """`retrain run ...` as the root CLI runs it, with `models` as the configuration folder; the newest
    run's record and its registration.json."""
    parser = argparse.ArgumentParser(prog="retrain")
    cli_local.register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["run", *argv])
    args.state_root, args.environ = state, {**os.environ, MODELS_DIR_VARIABLE: str(models)}
    out = io.StringIO()
    try:
        assert args.handler(args, out) == 0
    finally:
        print(out.getvalue())  # shown by pytest when a test fails
    record = RunStore(state / "runs").list(limit=1)[0]
    assert record.status == COMPLETED
    return record, json.loads((Path(record.outputs["registration"]) / "registration.json").read_text())


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


def test_a_regression_task_of_one_s_own_is_gated_by_its_metric_s_direction(tmp_path):
    models = tmp_path / "models"
    task_file = init_model("house", "custom", models).task_file
    state = tmp_path / "state"

    def batches(*seeds: int) -> Path:
        raw = tmp_path / ("raw-" + "-".join(map(str, seeds)))
        for seed in seeds:  # each seed adds a batch of new rows (their keys carry the seed)
            subprocess.run(
                [sys.executable, str(task_file), "--sample", str(raw / f"seed-{seed}"), "--rows", "800",
                 "--batches", "1", "--seed", str(seed)],
                check=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )  # fmt: skip
            (raw / f"seed-{seed}" / "batch-0001.csv").rename(raw / f"batch-{seed:04d}.csv")
            (raw / f"seed-{seed}").rmdir()
        return raw

    _, first = retrain_run(state, models, "--model-name", "house", "--data", str(batches(0)), *QUICK)
    assert (first["decision"]["accepted"], first["registered_version"]) == (True, "1")

    # Barely trained on more data: a higher (worse) mse than the champion's on the same test rows.
    _, worse = retrain_run(
        state, models, "--model-name", "house", "--data", str(batches(0, 1)),
        "--epochs", "1", "--param", "learning_rate=0.00001", *QUICK,
    )  # fmt: skip
    decision = worse["decision"]
    assert (decision["accepted"], worse["registered_version"]) == (False, None)
    assert decision["primary_metric"] == "mse" and decision["candidate_value"] > decision["champion_value"]
    assert "does not beat champion v1" in " ".join(decision["reasons"])

    # Trained longer on still more data: a lower (better) mse, promoted.
    _, better = retrain_run(
        state, models, "--model-name", "house", "--data", str(batches(0, 1, 2)), "--epochs", "15", *QUICK
    )
    decision = better["decision"]
    assert (decision["accepted"], better["registered_version"]) == (True, "2")
    assert decision["candidate_value"] < decision["champion_value"]


@pytest.fixture(autouse=True)
def _no_stray_configuration(monkeypatch):
    """Each run here names its configuration folder; the working folder's must not matter."""
    monkeypatch.delenv(MODELS_DIR_VARIABLE, raising=False)


def readme_block(name: str) -> str:
    """The code block the README marks `<!-- readme-task: NAME -->`, as a user would copy it."""
    text = (REPO_ROOT / "README.md").read_text()
    marker = f"<!-- readme-task: {name} -->\n"
    assert text.count(marker) == 1, f"the README has no single block marked {name}"
    block = text.split(marker, 1)[1]
    assert block.startswith("```")
    return block.split("\n", 1)[1].split("\n```\n", 1)[0] + "\n"


def test_the_readme_s_minimal_task_runs_to_a_champion_and_is_gated_by_mse(tmp_path):
    import pandas as pd

    models = tmp_path / "models"
    models.mkdir()
    for name in ("houses_task.py", "houses.toml"):
        (models / name).write_text(readme_block(name))
    state = tmp_path / "state"
    generator = np.random.default_rng(7)

    def batches(count: int) -> Path:  # each batch adds 300 new rows of price = w·x + 3 + noise
        raw = tmp_path / f"raw-{count}"
        raw.mkdir()
        for number in range(1, count + 1):
            x = np.random.default_rng(number).normal(size=(300, 3))
            price = x @ [2.0, -1.0, 0.5] + 3.0 + generator.normal(0.0, 0.1, size=300)
            frame = pd.DataFrame(x, columns=["x1", "x2", "x3"]).assign(price=price, listing=f"b{number}")
            frame.to_csv(raw / f"batch-{number:04d}.csv", index=False)
        return raw

    record, first = retrain_run(state, models, "--model-name", "houses", "--data", str(batches(2)), *QUICK)
    assert (first["decision"]["accepted"], first["registered_version"]) == (True, "1")
    assert first["decision"]["primary_metric"] == "mse"
    commands = {step.name: step.command for step in record.steps}
    train = commands["train"]
    assert train[train.index("--task") + 1] == f"{models / 'houses_task.py'}:HousePrices"

    _, worse = retrain_run(
        state, models, "--model-name", "houses", "--data", str(batches(3)),
        "--epochs", "1", "--param", "learning_rate=0.0001", *QUICK,
    )  # fmt: skip
    decision = worse["decision"]
    assert (decision["accepted"], worse["registered_version"]) == (False, None)
    assert decision["candidate_value"] > decision["champion_value"]

    _, better = retrain_run(
        state, models, "--model-name", "houses", "--data", str(batches(4)), "--epochs", "60", *QUICK
    )
    decision = better["decision"]
    assert (decision["accepted"], better["registered_version"]) == (True, "2")
    assert decision["candidate_value"] < decision["champion_value"]
