"""The evaluate and register steps' contracts: scores tied to the exact weights and data version, inputs
checked before anything is registered, and the stores found where the pipeline puts them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.training.small_run import NO_TRACKING, SMALL_RUN

from core.errors import InputError
from training.cli import main
from training.gate.evaluate import EVALUATION_FILE, EVALUATION_FORMAT, evaluate, load_trained_model
from training.gate.register import REGISTRATION_FILE, REGISTRATION_FORMAT
from training.gate.registry import MlflowStore, ModelRegistry, resolve_store
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.sample_data import write_sample_batches

FAST = ["--checkpoint-every-steps", "off", "--progress", "none"]


@pytest.fixture(scope="module")
def trained(prepared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trained")
    arguments = [
        "--data",
        str(prepared_data),
        "--out",
        str(root / "model"),
        "--checkpoints",
        str(root / "ck"),
    ]
    assert main(["train", *arguments, *SMALL_RUN, *NO_TRACKING, *FAST]) == 0
    return root / "model"


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def other_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("other")
    batches = write_sample_batches(root / "raw", batches=4)
    batches[-1].unlink()  # fewer rows: another data version
    prepare(root / "raw", root / "prepared")
    return root / "prepared"


@pytest.fixture(scope="module")
def evaluation(trained: Path, prepared_data: Path, tracking_uri: str, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("evaluation")
    argv = ["evaluate", "--model", str(trained), "--data", str(prepared_data), "--out", str(out)]
    assert main([*argv, "--model-name", "digits", "--mlflow-tracking-uri", tracking_uri]) == 0
    return out


def register_argv(trained: Path, evaluation: Path, data: Path, out: Path, tracking_uri: str) -> list[str]:
    return [
        "register",
        *("--model", str(trained), "--evaluation", str(evaluation), "--data", str(data)),
        *(
            "--model-name",
            "digits",
            "--raw-data-version",
            "rd-00000000000000aa",
            "--environment-version",
            "2",
        ),
        *("--out", str(out), "--mlflow-tracking-uri", tracking_uri, "--lock", str(out.parent / "locks")),
    ]


def test_evaluation_scores_the_candidate_on_its_own_test_split(trained: Path, evaluation: Path):
    document = json.loads((evaluation / EVALUATION_FILE).read_text())
    metadata = json.loads((trained / "metadata.json").read_text())
    assert document["format"] == EVALUATION_FORMAT and document["model_name"] == "digits"
    assert document["candidate"]["weights_sha256"] == metadata["weights_sha256"]
    assert document["data_version"] == metadata["data_version"]
    assert (document["split"], document["rows"]) == ("test", 188)
    metrics = document["candidate"]["metrics"]
    assert 0.8 < metrics["accuracy"] <= 1.0  # digits is easy; a broken model scores ~0.1
    assert 0.8 < metrics["macro_f1"] <= 1.0 and metrics["loss"] > 0
    assert sorted(name for name in metrics if name.startswith("recall_")) == [
        f"recall_{n}" for n in range(10)
    ]
    assert document["champion"] == {
        "state": "none",
        "version": None,
        "weights_sha256": None,
        "metrics": None,
        "error": None,
    }


def test_tampered_weights_are_refused(trained: Path, tmp_path: Path):
    copy = tmp_path / "model"
    shutil.copytree(trained, copy)
    payload = torch.load(copy / "model.pt", weights_only=True)
    first = next(key for key in payload["state_dict"] if key.endswith("weight"))
    payload["state_dict"][first] += 0.01
    torch.save(payload, copy / "model.pt")
    with pytest.raises(InputError, match="does not match the weights_sha256"):
        load_trained_model(copy)


def test_a_candidate_is_not_scored_on_another_data_version(
    trained: Path, other_data: Path, tracking_uri: str
):
    with pytest.raises(InputError, match="evaluate on the data version it was trained on"):
        evaluate(trained, other_data, "digits", ModelRegistry(MlflowStore(tracking_uri)))


def test_evaluation_needs_a_registry(trained: Path, prepared_data: Path, tmp_path: Path, capsys):
    argv = ["evaluate", "--model", str(trained), "--data", str(prepared_data), "--out", str(tmp_path)]
    assert main([*argv, "--model-name", "digits", "--mlflow-tracking-uri", "off"]) == 2
    assert "the champion lives in the MLflow registry" in capsys.readouterr().err
    assert not (tmp_path / EVALUATION_FILE).exists()


def test_registration_records_the_decision_lineage_and_metrics(
    trained: Path, evaluation: Path, prepared_data: Path, tracking_uri: str, tmp_path: Path
):
    out = tmp_path / "registration"
    argv = register_argv(trained, evaluation, prepared_data, out, tracking_uri)
    assert main([*argv, "--trigger", "event_id=evt-42,kind=blob,blob=a,b.csv"]) == 0
    record = json.loads((out / REGISTRATION_FILE).read_text())
    metadata = json.loads((trained / "metadata.json").read_text())
    assert record["format"] == REGISTRATION_FORMAT and record["model_name"] == "digits"
    assert record["decision"]["accepted"] is True and record["registered_version"] == "1"
    assert record["candidate"]["weights_sha256"] == metadata["weights_sha256"]
    lineage = record["lineage"]
    assert lineage["trigger"] == {
        "text": "event_id=evt-42,kind=blob,blob=a,b.csv",
        "kind": "blob",
        "event_id": "evt-42",
    }
    assert (lineage["raw_version"], lineage["data_version"]) == (
        "rd-00000000000000aa",
        metadata["data_version"],
    )
    assert lineage["environment_version"] == "2"
    assert record["metrics"] == json.loads((evaluation / EVALUATION_FILE).read_text())["candidate"]["metrics"]
    version = ModelRegistry(MlflowStore(tracking_uri)).version("digits", "1")
    assert version.tags["retrain.trigger.blob"] == "a,b.csv"  # a value with a comma survives


def rewrite(evaluation: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "evaluation"
    shutil.copytree(evaluation, copy)
    document = json.loads((copy / EVALUATION_FILE).read_text())
    change(document)
    (copy / EVALUATION_FILE).write_text(json.dumps(document))
    return copy


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda doc: doc["candidate"].update(weights_sha256="0" * 64), "evaluate the model being registered"),
        (lambda doc: doc.update(model_name="other"), "evaluate with the same --model-name"),
        (
            lambda doc: doc.update(format="retrain-evaluation/1"),
            "expected retrain-evaluation/2 (re-run evaluate)",
        ),
        (lambda doc: doc.pop("champion"), "incomplete evaluation (no 'champion'); re-run evaluate"),
    ],
    ids=["other-weights", "other-model-name", "old-format", "incomplete"],
)
def test_an_evaluation_that_does_not_belong_to_the_candidate_is_refused(
    trained, evaluation, prepared_data, tracking_uri, tmp_path, capsys, change, message
):
    changed = rewrite(evaluation, tmp_path, change)
    out = tmp_path / "registration"
    assert main(register_argv(trained, changed, prepared_data, out, tracking_uri)) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert not (out / REGISTRATION_FILE).exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--trigger", "not a trigger"], "--trigger 'not a trigger': expected 'manual' or KEY=VALUE"),
        (["--floors", "accuracy"], "--floors 'accuracy': expected METRIC=NUMBER"),
        (
            ["--primary-metric", "f1"],
            "the gate policy of retrain register: primary_metric names metric 'f1', which the task does not "
            "report; expected one of accuracy (higher is better), macro_f1 (higher is better), loss",
        ),
        (["--floors", "mse=0.1"], "floors names metric 'mse', which the task does not report"),
        (["--task-option", "hidden_width=32"], "--task-options/--task-option: give --task too"),
        (["--task", "tabular", "--task-option", "hidden_width=32"], '--task-options {"hidden_width":32}: '),
        (["--task", "training.tasks.base:Task"], "was trained with task 'tabular'; give that task"),
        (["--model-name", "no spaces"], "--model-name 'no spaces': expected 1-40 lowercase letters"),
        (["--environment-version", " "], "--environment-version is empty"),
    ],
)
def test_bad_register_options_are_refused_in_one_line(
    trained, evaluation, prepared_data, tracking_uri, tmp_path, capsys, extra, message
):
    out = tmp_path / "registration"
    assert main([*register_argv(trained, evaluation, prepared_data, out, tracking_uri), *extra]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert not (out / REGISTRATION_FILE).exists()


def test_registration_on_another_data_version_is_refused(
    trained, evaluation, other_data, tracking_uri, tmp_path
):
    out = tmp_path / "registration"
    assert main(register_argv(trained, evaluation, other_data, out, tracking_uri)) == 2
    assert not (out / REGISTRATION_FILE).exists()


def test_without_options_the_steps_use_the_state_folders_store_and_lock(
    trained: Path, prepared_data: Path, tmp_path: Path, monkeypatch
):
    state = tmp_path / "state"
    monkeypatch.setenv("RETRAIN_HOME", str(state))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    evaluation = tmp_path / "evaluation"
    argv = ["evaluate", "--model", str(trained), "--data", str(prepared_data), "--out", str(evaluation)]
    assert main([*argv, "--model-name", "digits"]) == 0
    register = [
        *("register", "--model", str(trained), "--evaluation", str(evaluation), "--data", str(prepared_data)),
        *("--model-name", "digits", "--raw-data-version", "rd-1", "--environment-version", "1"),
    ]
    assert main([*register, "--out", str(tmp_path / "registration")]) == 0
    assert (state / "locks" / "digits.lock").is_file()
    local = ModelRegistry(MlflowStore(f"sqlite:///{state / 'mlflow.db'}"))
    assert local.aliases("digits") == {"champion": "1"}
    assert local.version("digits", "1").source.startswith("models:/")
    assert any((state / "mlartifacts").rglob("model.pt"))  # artifacts in the state folder, not the cwd


def test_the_store_comes_from_the_option_then_the_environment_then_the_state_folder(tmp_path: Path):
    option = resolve_store(
        f"sqlite:///{tmp_path}/x/m.db", {"MLFLOW_TRACKING_URI": "http://ignored"}, tmp_path
    )
    assert option == MlflowStore(f"sqlite:///{tmp_path}/x/m.db", (tmp_path / "x" / "mlartifacts").as_uri())
    assert resolve_store(None, {"MLFLOW_TRACKING_URI": "azureml://ws"}, tmp_path) == MlflowStore(
        "azureml://ws"
    )
    local = resolve_store(None, {}, tmp_path / "state")
    assert local == MlflowStore(
        f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}", (tmp_path / "state" / "mlartifacts").as_uri()
    )
    with pytest.raises(InputError, match="'off': the champion lives in the MLflow registry"):
        resolve_store("off", {}, tmp_path)
