"""The gate against a real MLflow registry (SQLite), with models from the real trainer.

Four models, trained once for the module on the sample data, in increasing order of quality: `weak` (one
epoch of a tiny network, far below every floor), `mid`, `strong` and `best`. One MLflow store serves the
whole module; each test registers under a model name of its own.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow.pyfunc
import pandas as pd
import pytest
import yaml
from helpers.training.model_server import free_port, invoke, mlflow_models_serve, retrain_serve
from helpers.training.registry_harness import MODELS, Harness, build_harness, evaluation_document
from helpers.training.warm_training import WarmStarts
from mlflow.exceptions import MlflowException

from training.gate import lineage as tags
from training.gate.evaluate import EVALUATION_FILE, load_trained_model
from training.gate.pyfunc_model import predict
from training.gate.register import REGISTRATION_FILE
from training.gate.registry import CHAMPION, PREVIOUS, ModelLoadError

REPO_ROOT = Path(__file__).resolve().parents[3]
# Loads a registered model as a user would, in a fresh interpreter whose sys.path does not hold this
# repository: what it imports of `training` must come from the code registered with the model.
SERVE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    repo = Path(sys.argv[3]).resolve()
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != repo]
    import mlflow.pyfunc, pandas
    model = mlflow.pyfunc.load_model(sys.argv[1])
    import training
    answers = model.predict(pandas.read_csv(sys.argv[2]))
    print(json.dumps({"answers": [int(a) for a in answers], "training": training.__file__}))
    """
)


@pytest.fixture(scope="module")
def harness(prepared_data: Path, tmp_path_factory: pytest.TempPathFactory, trained_models: Path) -> Harness:
    # mid is trained with MLflow tracking: evaluate and register then log to and tag its run.
    root = tmp_path_factory.mktemp("registry")
    return build_harness(root, prepared_data, tuple(MODELS), tracked="mid", trained=trained_models)


# -- the gate's outcomes --------------------------------------------------------------------------------


def test_the_first_model_must_meet_the_floors(harness: Harness):
    record = harness.evaluate_and_register("weak", "first-floor")
    decision = record["decision"]
    assert decision["accepted"] is False and record["registered_version"] is None
    assert any("is below the floor 0.8" in reason for reason in decision["reasons"]), decision
    assert any("below the first-model floor 0.9" in reason for reason in decision["reasons"]), decision
    assert harness.registry.versions("first-floor") == []


def test_a_better_candidate_takes_champion_and_the_old_champion_becomes_previous(harness: Harness):
    first = harness.evaluate_and_register("mid", "better")
    assert first["decision"]["accepted"] is True
    assert first["decision"]["reasons"] == ["no champion yet; first-model floors met"]
    assert first["registered_version"] == "1"

    evaluation = harness.evaluate("strong", "better")
    champion = evaluation_document(evaluation)["champion"]
    assert (champion["state"], champion["version"], champion["weights_sha256"]) == (
        "loaded",
        "1",
        harness.weights("mid"),
    )
    second = harness.register("strong", evaluation, "better")
    assert second["decision"]["accepted"] is True
    assert second["registered_version"] == "2"
    assert second["champion_compared"]["scores_from"] == "the evaluation"
    assert harness.registry.aliases("better") == {CHAMPION: "2", PREVIOUS: "1"}
    assert harness.champion_weights("better") == harness.weights("strong")


def test_registering_leaves_no_mlflow_uri_in_the_environment(harness: Harness, monkeypatch):
    # MLflow's set_tracking_uri exports MLFLOW_TRACKING_URI: left behind, every process started later (a
    # pipeline step) would use the working directory's store instead of the state folder's.
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        monkeypatch.delenv(name, raising=False)

    assert harness.evaluate_and_register("mid", "no-leak")["registered_version"] == "1"

    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ


def test_the_champion_serves_a_raw_csv_as_it_is_through_mlflow_pyfunc(harness: Harness, tmp_path: Path):
    record = harness.evaluate_and_register("strong", "servable")
    raw_file = harness.data.parent / "raw" / "batch-0001.csv"
    served = subprocess.run(
        [sys.executable, "-c", SERVE, "models:/servable@champion", str(raw_file), str(REPO_ROOT)],
        env={**os.environ, "MLFLOW_TRACKING_URI": harness.tracking_uri, "PYTHONPATH": ""},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert served.returncode == 0, served.stderr[-3000:]
    result = json.loads(served.stdout.strip().splitlines()[-1])
    assert not Path(result["training"]).resolve().is_relative_to(REPO_ROOT)  # the registered code copy

    table = pd.read_csv(raw_file)  # integer pixels, plus the key and the label the model ignores
    expected = predict(load_trained_model(harness.models["strong"]).rebuilt, table)
    assert result["answers"] == expected.tolist()
    assert (expected == table["label"].to_numpy()).mean() > 0.9  # real answers: digits is easy

    info = harness.registry.version("servable", record["registered_version"])
    champion = harness.registry.load_model(info)  # the gate's own loader: the same model
    assert predict(champion, table).tolist() == result["answers"]
    mlmodel = yaml.safe_load(harness.registry.download_model_file(info, "MLmodel", tmp_path).read_text())
    assert "python_function" in mlmodel["flavors"]
    inputs = json.loads(mlmodel["signature"]["inputs"])
    assert [column["name"] for column in inputs] == [f"pixel_{n}" for n in range(64)]
    assert {column["type"] for column in inputs} == {"long"}  # digits' pixels are whole numbers: int64
    assert mlmodel["saved_input_example_info"]["type"] == "dataframe"
    manifest = harness.registry.download_model_file(info, "artifacts/manifest.json", tmp_path / "m")
    assert manifest.read_bytes() == (harness.data / "manifest.json").read_bytes()


def test_the_champion_served_by_mlflow_models_serve_answers_a_raw_csv_body_as_every_json_form(
    harness: Harness, tmp_path: Path, monkeypatch
):
    harness.evaluate_and_register("strong", "served")
    raw_file = harness.data.parent / "raw" / "batch-0001.csv"
    table = pd.read_csv(raw_file)  # the key and the label too: a raw file as users upload it
    expected = predict(load_trained_model(harness.models["strong"]).rebuilt, table).tolist()
    bodies = {
        "text/csv": raw_file.read_bytes(),
        "dataframe_split": json.dumps(
            {"dataframe_split": json.loads(table.to_json(orient="split"))}
        ).encode(),
        "dataframe_records": json.dumps({"dataframe_records": table.to_dict(orient="records")}).encode(),
        "inputs": json.dumps({"inputs": table.to_dict(orient="list")}).encode(),
        "instances": json.dumps({"instances": table.to_dict(orient="records")}).encode(),
    }
    decimal = table.astype({"pixel_5": "float64"})
    decimal.loc[0, "pixel_5"] = 0.5  # a decimal where the training data has only whole numbers

    with mlflow_models_serve("models:/served@champion", harness.tracking_uri, tmp_path / "serve.log") as url:
        answers = {form: invoke(url, body, _content_type(form)) for form, body in bodies.items()}
        refused = invoke(url, decimal.to_csv(index=False).encode(), "text/csv")

    for form, (status, text) in answers.items():
        assert status == 200, (form, text[:2000])
    predictions = {form: json.loads(text)["predictions"] for form, (_, text) in answers.items()}
    assert predictions == dict.fromkeys(bodies, expected)
    # The CSV parser names the column by its 0-based position in the body; in process MLflow names it.
    status, text = refused
    position = list(decimal.columns).index("pixel_5")
    assert status == 400 and f"for float64 dtyped data in column {position}'" in text, text[:2000]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", harness.tracking_uri)
    with pytest.raises(MlflowException, match="Incompatible input types for column pixel_5"):
        mlflow.pyfunc.load_model("models:/served@champion").predict(decimal)


def test_retrain_serve_serves_the_champion_from_the_local_state_folder(harness: Harness, tmp_path: Path):
    # The harness's store is a state folder's (mlflow.db and mlartifacts/ in one folder): RETRAIN_HOME
    # alone must lead `retrain serve` to it, with no MLflow variable set and another working folder.
    record = harness.evaluate_and_register("strong", "retrain-served")
    assert record["registered_version"] == "1"
    table = pd.read_csv(harness.data.parent / "raw" / "batch-0001.csv").head(20)
    expected = predict(load_trained_model(harness.models["strong"]).rebuilt, table).tolist()
    environ = {name: value for name, value in os.environ.items() if not name.startswith("MLFLOW_")}
    environ |= {"RETRAIN_HOME": str(harness.root), "PYTHONPATH": str(REPO_ROOT)}

    with retrain_serve("retrain-served", environ, tmp_path, tmp_path / "serve.log") as url:
        body = json.dumps({"dataframe_split": json.loads(table.to_json(orient="split"))}).encode()
        status, text = invoke(url, body, "application/json")

    assert status == 200, text[:2000]
    assert json.loads(text)["predictions"] == expected
    said = (tmp_path / "serve.log").read_text().splitlines()[0]
    assert said.startswith("serving retrain-served v1 (retrain-served@champion) at http://127.0.0.1:"), said
    assert not (tmp_path / "mlruns").exists()  # nothing looked in MLflow's default store


def test_retrain_serve_without_a_champion_says_what_it_looked_for(harness: Harness, capsys):
    from retrain_cli import main as retrain_main

    harness.evaluate_and_register("weak", "never-champion")  # refused by the floors: a model, no champion
    uri = harness.tracking_uri
    for name in ("never-champion", "never-registered"):
        code = retrain_main(["serve", name, "--mlflow-tracking-uri", uri, "--port", str(free_port())])
        error = capsys.readouterr().err.strip()
        assert code != 0
        assert error == (
            f"retrain: error: retrain serve {name}: no version of model {name!r} holds the 'champion' alias "
            f"in the MLflow registry at {uri}; `retrain models --model-name {name}` lists its versions, "
            f"`retrain run --model-name {name}` trains one"
        )
    assert retrain_main(["serve", "never-champion", "--mlflow-tracking-uri", uri, "--port", "70000"]) != 0
    assert (
        capsys.readouterr().err.strip() == "retrain: error: --port 70000: expected a TCP port from 1 to 65535"
    )


def _content_type(form: str) -> str:
    return "text/csv" if form == "text/csv" else "application/json"


def test_a_versions_source_run_is_its_training_run_with_the_loss_curve(harness: Harness):
    record = harness.evaluate_and_register("mid", "sourced")  # mid was trained with MLflow tracking
    info = harness.registry.version("sourced", record["registered_version"])
    training_run = load_trained_model(harness.models["mid"]).metadata["mlflow_run_id"]
    assert info.run_id == training_run
    assert len(harness.client.get_metric_history(training_run, "loss")) > 1
    run = harness.client.get_run(training_run)
    assert {"train_loss", "validation_macro_f1", "test_macro_f1"} <= set(run.data.metrics)
    assert run.info.status == "FINISHED"

    untracked = harness.evaluate_and_register("strong", "register-run")  # trained with --no-mlflow
    version = harness.registry.version("register-run", untracked["registered_version"])
    register_run = harness.client.get_run(version.run_id)
    assert register_run.data.tags["retrain.step"] == "register"


def test_a_worse_candidate_is_not_registered_and_the_decision_is_on_its_run(harness: Harness):
    harness.evaluate_and_register("strong", "worse")
    record = harness.evaluate_and_register("mid", "worse")
    decision = record["decision"]
    assert decision["accepted"] is False and record["registered_version"] is None
    assert "does not beat champion v1's" in decision["reasons"][0]
    assert [info.version for info in harness.registry.versions("worse")] == ["1"]
    assert harness.registry.aliases("worse") == {CHAMPION: "1"}

    run_id = load_trained_model(harness.models["mid"]).metadata["mlflow_run_id"]
    run = harness.client.get_run(run_id)
    assert run.data.tags[tags.GATE_ACCEPTED] == "false"
    assert json.loads(run.data.tags[tags.GATE_REASONS]) == decision["reasons"]
    assert run.data.tags[tags.REGISTERED_VERSION] == "none"
    assert json.loads(run.data.tags[tags.GATE_POLICY])["primary_metric"] == "macro_f1"
    # The evaluate step logged the candidate's test scores and its evaluation.json to the same run.
    assert run.data.metrics["test_macro_f1"] == pytest.approx(record["metrics"]["macro_f1"])
    artifacts = [entry.path for entry in harness.client.list_artifacts(run_id)]
    assert EVALUATION_FILE in artifacts


def test_an_improvement_inside_the_margin_is_not_registered(harness: Harness):
    harness.evaluate_and_register("mid", "margin")
    record = harness.evaluate_and_register("strong", "margin", "--min-improvement", "0.05")
    decision = record["decision"]
    assert decision["accepted"] is False
    improvement = decision["candidate_value"] - decision["champion_value"]
    assert 0 < improvement < 0.05  # a real improvement, just not enough
    assert "by the margin 0.05" in decision["reasons"][0]
    assert record["decision"]["policy"]["min_improvement"] == "0.05"
    assert harness.registry.aliases("margin") == {CHAMPION: "1"}


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (lambda metrics: metrics.update(macro_f1=math.nan), "candidate's macro_f1 is not a finite number"),
        (lambda metrics: metrics.pop("macro_f1"), "candidate has no macro_f1"),
    ],
    ids=["nan", "missing"],
)
def test_nan_or_missing_metrics_are_rejected(harness: Harness, tamper, reason: str):
    model_name = f"unusable-{len(reason)}"
    evaluation = harness.evaluate("strong", model_name)
    document = evaluation_document(evaluation)
    tamper(document["candidate"]["metrics"])
    (evaluation / EVALUATION_FILE).write_text(json.dumps(document))
    record = harness.register("strong", evaluation, model_name)
    assert record["decision"]["accepted"] is False
    assert record["decision"]["reasons"] == [reason]
    assert harness.registry.versions(model_name) == []


# -- the compare-and-set --------------------------------------------------------------------------------


def test_a_candidate_is_refused_when_a_better_champion_appeared_after_its_evaluation(harness: Harness):
    harness.evaluate_and_register("mid", "interleaved")
    evaluated_a = harness.evaluate("strong", "interleaved")  # A: compared with v1 (mid), which it beats
    evaluated_b = harness.evaluate("best", "interleaved")  # B: compared with v1 too
    assert evaluation_document(evaluated_a)["champion"]["version"] == "1"

    b = harness.register("best", evaluated_b, "interleaved")
    assert b["registered_version"] == "2"
    a = harness.register("strong", evaluated_a, "interleaved")

    assert a["decision"]["accepted"] is False and a["registered_version"] is None
    assert a["decision"]["champion_version"] == "2"
    assert "does not beat champion v2's" in a["decision"]["reasons"][0]
    compared = a["champion_compared"]
    assert compared["scores_from"] == "re-read under the lock"
    # Re-scored on the candidate's split by the same code: exactly B's own evaluation numbers.
    assert compared["metrics"] == evaluation_document(evaluated_b)["candidate"]["metrics"]
    assert harness.registry.aliases("interleaved") == {CHAMPION: "2", PREVIOUS: "1"}


def test_two_registrations_racing_for_the_alias_leave_the_better_model_as_champion(
    harness: Harness, warm_starts: WarmStarts
):
    evaluations = {model: harness.evaluate(model, "race") for model in ("mid", "strong")}
    outs = {model: harness.folder("registration") for model in evaluations}
    logs = {model: harness.root / f"race-{model}.log" for model in evaluations}
    commands = {
        model: [
            sys.executable,
            "-m",
            "training.cli",
            *harness.register_argv(model, evaluation, "race", outs[model]),
        ]
        for model, evaluation in evaluations.items()
    }
    # Two processes at once, each forked warm.
    processes = {
        model: warm_starts.start(command, dict(os.environ), logs[model])
        for model, command in commands.items()
    }
    for model, process in processes.items():
        assert process.wait(timeout=240) == 0, logs[model].read_text()[-3000:]

    records = {model: json.loads((out / REGISTRATION_FILE).read_text()) for model, out in outs.items()}
    assert harness.champion_weights("race") == harness.weights("strong")
    assert records["strong"]["decision"]["accepted"] is True
    versions = harness.registry.versions("race")
    if records["mid"]["decision"]["accepted"]:  # mid got the lock first: strong then beat it
        assert [info.weights_sha256 for info in versions] == [
            harness.weights("strong"),
            harness.weights("mid"),
        ]
        assert harness.registry.aliases("race") == {CHAMPION: "2", PREVIOUS: "1"}
        assert records["strong"]["champion_compared"]["scores_from"] == "re-read under the lock"
    else:  # strong got it first: mid, re-scored against it, lost
        assert [info.weights_sha256 for info in versions] == [harness.weights("strong")]
        assert "does not beat champion v1's" in records["mid"]["decision"]["reasons"][0]


# -- unloadable champions -------------------------------------------------------------------------------


def test_an_unloadable_champion_blocks_registration_unless_bootstrapped(harness: Harness):
    harness.evaluate_and_register("mid", "broken")
    info = harness.registry.version("broken", "1")
    model_id = info.source.removeprefix("models:/")
    location = harness.client.get_logged_model(model_id).artifact_location
    (Path(location.removeprefix("file://")) / "artifacts" / "model.pt").unlink()  # the store lost it

    evaluation = harness.evaluate("strong", "broken")
    champion = evaluation_document(evaluation)["champion"]
    assert (champion["state"], champion["version"], champion["metrics"]) == ("unloadable", "1", None)
    assert "models:/broken/1 cannot be loaded" in champion["error"]

    refused = harness.register("strong", evaluation, "broken")
    assert refused["decision"]["accepted"] is False
    assert "champion v1 cannot be loaded" in refused["decision"]["reasons"][0]
    assert "allow a bootstrap" in refused["decision"]["reasons"][0]

    bootstrapped = harness.register("strong", evaluation, "broken", "--bootstrap-unloadable-champion", "true")
    assert bootstrapped["decision"]["accepted"] is True
    assert bootstrapped["decision"]["reasons"] == [
        "bootstrap over unloadable champion v1; first-model floors met"
    ]
    assert harness.registry.aliases("broken") == {CHAMPION: "2", PREVIOUS: "1"}


def test_a_version_whose_weights_differ_from_its_tag_does_not_load(harness: Harness):
    record = harness.evaluate_and_register("mid", "tampered")
    harness.registry.tag_version("tampered", record["registered_version"], {tags.WEIGHTS_SHA256: "0" * 64})
    info = harness.registry.version("tampered", record["registered_version"])
    with pytest.raises(ModelLoadError, match="not the registered 000000000000; its artifacts were changed"):
        harness.registry.load_model(info)
