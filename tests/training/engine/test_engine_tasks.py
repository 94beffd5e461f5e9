"""The engine trains any task: the tabular task on another table's columns, and a user's task from a file
whose splits take only int indices (the engine batches them itself) and whose metric is lower-is-better."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers.training.iris import SPECIES, write_iris

from core.errors import InputError
from training.cli import main
from training.engine.outputs import MODEL_FORMAT, load_model_file, read_model_payload, weights_sha256

RUN = ["--epochs", "12", "--global-batch-size", "16", "--seed", "3", "--checkpoint-every-seconds", "off"]
QUIET = ["--no-mlflow", "--progress", "none"]

USER_TASK = '''
import hashlib, json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from training.tasks.base import FeatureTable, Metric, MetricSet, TaskData


class Points:
    """A map-style split that answers one int index at a time, as many user datasets do."""

    def __init__(self, x, y):
        self.x, self.y = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, index):
        if not isinstance(index, int):
            raise TypeError("one int index at a time")
        return {"x": self.x[index], "y": self.y[index]}


class Line:
    name = "line"
    raw_suffixes = (".json",)
    metrics = MetricSet((Metric("mse", "lower"),))
    default_primary_metric = "mse"

    def __init__(self, width=8):
        self.width = width

    def options(self):
        return {"width": self.width}

    def prepare(self, raw, out, *, previous, split):
        rows = json.loads((Path(raw) / "points.json").read_text())
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "points.json").write_text(json.dumps(rows))
        return "dv-" + hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]

    def load(self, data_dir):
        text = (Path(data_dir) / "points.json").read_text()
        rows = json.loads(text)
        version = "dv-" + hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
        x = [[row[0]] for row in rows]
        y = [row[1] for row in rows]
        held = [index % 5 == 0 for index in range(len(rows))]
        train = Points([a for a, h in zip(x, held) if not h], [b for b, h in zip(y, held) if not h])
        other = Points([a for a, h in zip(x, held) if h], [b for b, h in zip(y, held) if h])
        splits = {"train": train, "validation": other, "test": other}
        return TaskData(version, splits, {"inputs": 1})

    def build_model(self, info):
        return nn.Sequential(nn.Linear(info["inputs"], self.width), nn.Tanh(), nn.Linear(self.width, 1))

    def loss(self, model, batch):
        return nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])

    def score(self, model, split):
        device = next(model.parameters()).device
        predicted = model(split.x.to(device)).squeeze(1)
        return {"mse": nn.functional.mse_loss(predicted, split.y.to(device)).item()}

    def input_example(self, data):
        return np.array([[0.5]], dtype=np.float32)

    def predict(self, model, info, inputs):
        return model(torch.as_tensor(np.asarray(inputs, dtype=np.float32))).squeeze(1).numpy()

    def drift_features(self, source, *, prepared):
        rows = json.loads((Path(source) / "points.json").read_text())
        return FeatureTable(("x",), np.array([[row[0]] for row in rows]))


class Incomplete(Line):
    loss = None
'''


@pytest.fixture(scope="module")
def iris_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An iris CSV (species as names, no key column) prepared and trained from the command line."""
    root = tmp_path_factory.mktemp("iris")
    write_iris(root / "raw")
    options = ["--task-option", "label_column=species", "--task-option", "key_column=null"]
    options += ["--task-options", json.dumps({"classes": SPECIES, "hidden_width": 32})]
    assert main(["prepare", "--raw", str(root / "raw"), "--out", str(root / "prepared"), *options]) == 0
    arguments = ["--data", str(root / "prepared"), "--out", str(root / "model")]
    arguments += ["--checkpoints", str(root / "checkpoints"), *options, *RUN, *QUIET]
    assert main(["train", *arguments]) == 0
    return root


def test_the_tabular_task_trains_on_another_label_column_and_other_feature_names(iris_model):
    metadata = json.loads((iris_model / "model" / "metadata.json").read_text())

    assert metadata["task"]["ref"] == "tabular"
    assert metadata["task"]["options"]["label_column"] == "species"
    assert metadata["info"]["feature_columns"] == [
        "sepal_length",
        "sepal_width",
        "petal_length",
        "petal_width",
    ]
    assert metadata["final_metrics"]["validation_accuracy"] > 0.8
    assert {"validation_loss", "validation_macro_f1", "validation_recall_0", "train_loss"} <= set(
        metadata["final_metrics"]
    )


def test_the_model_file_rebuilds_the_trained_model_through_its_task(iris_model):
    payload = read_model_payload(iris_model / "model")
    task, model, _ = load_model_file(iris_model / "model" / "model.pt")

    assert payload["format"] == MODEL_FORMAT == "retrain-model/2"
    assert payload["info"]["classes"] == SPECIES
    metadata = json.loads((iris_model / "model" / "metadata.json").read_text())
    assert weights_sha256(model) == metadata["weights_sha256"]
    assert not model.training
    answers = task.predict(model, payload["info"], pd.read_csv(iris_model / "raw" / "iris.csv"))
    truth = pd.read_csv(iris_model / "raw" / "iris.csv")["species"]
    assert (answers == truth.to_numpy()).mean() > 0.8


def test_a_model_file_of_another_format_is_refused_in_one_line(tmp_path):
    torch.save({"format": "retrain-model/1", "model_config": {}}, tmp_path / "model.pt")

    with pytest.raises(InputError, match=r"format 'retrain-model/1'; expected a retrain-model/2 model.pt"):
        load_model_file(tmp_path)


@pytest.fixture(scope="module")
def points(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("points")
    (root / "task.py").write_text(USER_TASK)
    (root / "raw").mkdir()
    rows = [[index / 50, 2 * index / 50 - 1] for index in range(100)]
    (root / "raw" / "points.json").write_text(json.dumps(rows))
    return root


def test_a_user_task_whose_splits_take_int_indices_trains_and_reports_its_own_metric(points):
    task = ["--task", f"{points / 'task.py'}:Line", "--task-option", "width=4"]
    assert main(["prepare", "--raw", str(points / "raw"), "--out", str(points / "prepared"), *task]) == 0
    arguments = ["--data", str(points / "prepared"), "--out", str(points / "model")]
    arguments += ["--checkpoints", str(points / "checkpoints"), *task, *RUN, *QUIET]
    arguments += ["--learning-rate", "0.03", "--epochs", "30"]  # later flags win: a line fits fast

    assert main(["train", *arguments]) == 0

    metadata = json.loads((points / "model" / "metadata.json").read_text())
    assert set(metadata["final_metrics"]) == {"validation_mse", "train_loss"}
    assert metadata["final_metrics"]["validation_mse"] < 0.1  # predicting the mean scores 1.33
    loaded_task, model, payload = load_model_file(points / "model")
    assert payload["task_options"] == {"width": 4}
    assert weights_sha256(model) == metadata["weights_sha256"]
    with torch.no_grad():  # as serving calls it
        assert loaded_task.predict(model, payload["info"], [[0.5]]).shape == (1,)


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("Incomplete", "not a complete task, it lacks loss()"),
        ("Missing", "has no attribute 'Missing'"),
    ],
)
def test_a_task_that_does_not_load_is_one_line_before_any_process_starts(
    points, tmp_path, capsys, task, expected
):
    arguments = ["--data", str(points / "raw"), "--out", str(tmp_path / "out"), "--nproc", "2"]
    arguments += ["--checkpoints", str(tmp_path / "checkpoints"), "--task", f"{points / 'task.py'}:{task}"]

    assert main(["train", *arguments, *QUIET]) == 2

    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("retrain: error:")]
    assert len(lines) == 1 and expected in lines[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == []
