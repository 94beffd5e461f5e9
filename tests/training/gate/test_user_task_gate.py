"""A user's own task end to end through the step commands: a regression
(tests/helpers/training/regression_task.py, written from the task contract alone) whose primary metric, mse,
is lower-is-better.

The gate reads the direction from the task: a first model becomes the champion, a worse one (higher mse)
is refused, a better one promoted. The champion then serves and drifts with the task file shipped in the
model, after the user's copy is gone. The user's task file imports the task from a module beside it, as a
user splits code: the module is the task's code, and ships with the model too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers.training.regression_task import write_sample

from core.sources import task_sources_sha256
from core.task_ref import parse_task_ref
from training.cli import main
from training.drift.cli import REPORT_FILE
from training.gate import lineage as tags
from training.gate.evaluate import EVALUATION_FILE
from training.gate.pyfunc_model import predict
from training.gate.register import REGISTRATION_FILE
from training.gate.registry import CHAMPION, PREVIOUS, MlflowStore, ModelRegistry

TASK_SOURCE = Path(__file__).parents[2] / "helpers" / "training" / "regression_task.py"
# The file --task names: the task itself lives in the module beside it (a copy of TASK_SOURCE).
HOUSES_TASK = "from regression_task import RegressionTask  # a module of this folder\n"
MODEL = "house-prices"
# Epochs give a clear ranking (validation mse about 1.5, 0.3 and 0.007 on the sample).
CANDIDATES = {"worse": "2", "first": "4", "better": "20"}
TRAIN = [
    *("--learning-rate", "0.05", "--warmup-steps", "0", "--global-batch-size", "32", "--seed", "3"),
    *("--progress", "none", "--no-mlflow", "--checkpoint-every-steps", "off"),
]


class Story:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.task_file = root / "user" / "houses_task.py"  # the user's copy, deleted later
        self.task = f"{self.task_file}:RegressionTask"
        self.code_sha256 = ""  # the task's code: the file and the module it imports
        self.raw, self.data = root / "raw", root / "prepared"
        self.tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
        self.registry = ModelRegistry(MlflowStore(self.tracking_uri, (root / "mlartifacts").as_uri()))
        self.records: dict[str, dict] = {}

    def run(self, *argv: str) -> None:
        assert main(list(argv)) == 0, argv

    def evaluate_and_register(self, name: str) -> dict:
        model, evaluation, out = (
            self.root / kind / name for kind in ("models", "evaluations", "registrations")
        )
        store = ("--model-name", MODEL, "--mlflow-tracking-uri", self.tracking_uri)
        task = ("--task", self.task)
        self.run(
            "evaluate",
            "--model",
            str(model),
            "--data",
            str(self.data),
            "--out",
            str(evaluation),
            *task,
            *store,
        )
        self.run(
            *("register", "--model", str(model), "--evaluation", str(evaluation), "--data", str(self.data)),
            *("--raw-data-version", "rd-00000000000000bb", "--environment-version", "1", "--out", str(out)),
            *task,
            *store,
            *("--lock", str(self.root / "locks")),
        )
        self.records[name] = json.loads((out / REGISTRATION_FILE).read_text())
        return self.records[name]


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    story = Story(tmp_path_factory.mktemp("user-task"))
    story.task_file.parent.mkdir()
    story.task_file.write_text(HOUSES_TASK)
    shutil.copy(TASK_SOURCE, story.task_file.with_name("regression_task.py"))
    story.code_sha256 = task_sources_sha256(parse_task_ref(story.task), []).sha256
    write_sample(story.raw, rows=600, seed=0)
    story.run("prepare", "--task", story.task, "--raw", str(story.raw), "--out", str(story.data))
    for name, epochs in CANDIDATES.items():
        locations = ("--data", str(story.data), "--out", str(story.root / "models" / name))
        checkpoints = ("--checkpoints", str(story.root / "checkpoints" / name))
        story.run("train", "--task", story.task, *locations, *checkpoints, "--epochs", epochs, *TRAIN)
    for name in ("first", "worse", "better"):
        story.evaluate_and_register(name)
    shutil.rmtree(story.task_file.parent)  # from here on, only the copy registered with the model exists
    return story


def test_the_gate_reads_the_direction_of_the_tasks_metric(story: Story):
    first, worse, better = (story.records[name] for name in ("first", "worse", "better"))
    assert first["decision"]["accepted"] and first["registered_version"] == "1"
    assert first["decision"]["reasons"] == ["no champion yet; first-model floors met"]
    assert first["decision"]["policy"] == {
        "primary_metric": "mse",
        "min_improvement": "0.002",
        "floors": "none",
        "max_regression": "none",
        "first_model_floors": "none",
        "bootstrap_unloadable_champion": "false",
    }

    assert worse["decision"]["accepted"] is False and worse["registered_version"] is None
    assert worse["metrics"]["mse"] > first["metrics"]["mse"]  # higher mse: worse, whatever the number says
    assert worse["decision"]["reasons"][0].startswith(
        f"mse {worse['metrics']['mse']:.4f} does not beat champion v1's {first['metrics']['mse']:.4f}"
    )

    assert better["decision"]["accepted"] and better["registered_version"] == "2"
    assert better["metrics"]["mse"] < first["metrics"]["mse"] / 10
    assert better["decision"]["reasons"][0].startswith(
        f"mse {better['metrics']['mse']:.4f} beats champion v1's"
    )
    assert story.registry.aliases(MODEL) == {CHAMPION: "2", PREVIOUS: "1"}


def test_the_evaluation_scores_every_metric_the_task_declares(story: Story):
    evaluation = json.loads((story.root / "evaluations" / "better" / EVALUATION_FILE).read_text())
    assert set(evaluation["candidate"]["metrics"]) == {"mse", "mae", "r2"}
    assert evaluation["champion"]["version"] == "1"
    assert evaluation["champion"]["metrics"] == story.records["first"]["metrics"]  # the same code, data
    assert evaluation["task"]["ref"] == story.task
    assert evaluation["task"]["options"] == {}
    assert evaluation["task"]["file_sha256"] == hashlib.sha256(HOUSES_TASK.encode()).hexdigest()
    assert evaluation["task"]["code_sha256"] == story.code_sha256  # what the step cache keys on
    assert story.code_sha256 != evaluation["task"]["file_sha256"]  # the module beside the file counts


def test_the_version_records_the_task_and_ships_its_file(story: Story, tmp_path: Path):
    info = story.registry.version(MODEL, "2")
    assert info.tags[tags.TASK_REF] == story.task
    assert info.tags[tags.TASK_NAME] == "linear-regression"
    assert json.loads(info.tags[tags.TASK_OPTIONS]) == {}
    assert info.tags[tags.TASK_FILE_SHA256] == hashlib.sha256(HOUSES_TASK.encode()).hexdigest()
    assert info.tags[tags.TASK_CODE_SHA256] == story.code_sha256
    shipped = story.registry.download_model_file(info, "artifacts/houses_task.py", tmp_path)
    assert shipped.read_text() == HOUSES_TASK
    module = story.registry.download_model_file(info, "artifacts/regression_task.py", tmp_path)
    assert module.read_bytes() == TASK_SOURCE.read_bytes()  # beside it, where its import finds it


# What a fresh process answers from the champion: none of the user's modules imported, their folder gone.
SERVE = """
import json, sys, mlflow.pyfunc, pandas
served = mlflow.pyfunc.load_model(sys.argv[1])
columns = {spec.name: spec.type.name for spec in served.metadata.get_input_schema().inputs}
print(json.dumps([columns, served.predict(pandas.read_csv(sys.argv[2])).tolist()]))
"""


def test_the_champion_serves_a_csv_in_a_fresh_process_with_the_shipped_task_file_and_module(story: Story):
    assert not story.task_file.parent.exists()
    environ = {**os.environ, "MLFLOW_TRACKING_URI": story.tracking_uri}
    environ.pop("PYTHONPATH", None)
    sample = story.raw / "sample-0.csv"
    done = subprocess.run(
        [sys.executable, "-c", SERVE, f"models:/{MODEL}@{CHAMPION}", str(sample)],
        cwd=story.root,
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert done.returncode == 0, done.stderr[-2000:]
    columns, answers = json.loads(done.stdout.strip().splitlines()[-1])
    table = pd.read_csv(sample)  # the target column too, which the model ignores
    assert np.abs(np.asarray(answers) - table["y"].to_numpy()).mean() < 0.2
    assert columns == {"x0": "double", "x1": "double", "x2": "double"}  # decimals: read_csv's float64
    champion = story.registry.load_model(story.registry.version(MODEL, "2"))  # the gate's loader agrees
    assert np.allclose(predict(champion, table), answers)


def test_drift_compares_the_champions_task_features_from_its_lineage(story: Story, tmp_path: Path):
    write_sample(tmp_path / "same", rows=300, seed=1)
    write_sample(tmp_path / "moved", rows=300, seed=2, shift=1.5)
    results = {}
    for name in ("same", "moved"):
        out = tmp_path / f"report-{name}"
        store = ("--mlflow-tracking-uri", story.tracking_uri, "--no-publish")
        story.run(
            "drift", "--model-name", MODEL, "--current", str(tmp_path / name), "--out", str(out), *store
        )
        results[name] = json.loads((out / REPORT_FILE).read_text())
    assert results["same"]["alert"] is False
    assert results["moved"]["alert"] is True
    assert {feature["name"] for feature in results["moved"]["features"]} == {"x0", "x1", "x2"}
    assert results["moved"]["task"]["name"] == "linear-regression"
    assert results["moved"]["task"]["from"] == f"models:/{MODEL}/2's lineage"
    assert results["moved"]["reference"]["model_version"] == "2"


def test_models_lists_the_tasks_metrics_primary_first(story: Story, capsys):
    capsys.readouterr()
    story.run("models", "--model-name", MODEL, "--mlflow-tracking-uri", story.tracking_uri)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["VERSION", "ALIASES", "MSE", "MAE", "R2"]
    assert lines[1].split()[:3] == ["v2", "champion", f"{story.records['better']['metrics']['mse']:.4f}"]
