"""`retrain models`, `retrain lineage` and `retrain rollback` on versions the register step really made."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.training.registry_harness import RAW_VERSION, Harness, build_harness

from training.cli import main
from training.gate import lineage as tags
from training.gate.lineage import code_version, file_sha256
from training.gate.registry import CHAMPION, PREVIOUS

HISTORY = ("mid", "strong", "best")  # each beats the one before: three versions, each the champion in turn


@pytest.fixture(scope="module")
def harness(prepared_data: Path, tmp_path_factory: pytest.TempPathFactory, trained_models: Path) -> Harness:
    harness = build_harness(
        tmp_path_factory.mktemp("registry-cli"), prepared_data, HISTORY, trained=trained_models
    )
    with pytest.MonkeyPatch.context() as patch:
        for number, model in enumerate(HISTORY, start=1):
            patch.setenv("RETRAIN_PIPELINE_RUN", f"run-history-{number}")
            assert harness.evaluate_and_register(model, "history")["registered_version"] == str(number)
    return harness


def run(harness: Harness, capsys, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--mlflow-tracking-uri", harness.tracking_uri])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_version_carries_its_lineage_as_tags(harness: Harness):
    info = harness.registry.version("history", "3")
    expected = {
        tags.TRIGGER: "event_id=evt-best,kind=blob",
        tags.TRIGGER_KIND: "blob",
        tags.TRIGGER_EVENT_ID: "evt-best",
        tags.RAW_DATA_VERSION: RAW_VERSION,
        tags.DATA_VERSION: json.loads((harness.data / "manifest.json").read_text())["data_version"],
        tags.MANIFEST_PATH: str((harness.data / "manifest.json").resolve()),
        tags.MANIFEST_SHA256: file_sha256(harness.data / "manifest.json"),
        tags.CODE_SOURCE: code_version()[0],
        tags.CODE_VERSION: code_version()[1],
        tags.ENVIRONMENT_VERSION: "7",
        tags.PIPELINE_JOB: "run-history-3",
        tags.WEIGHTS_SHA256: harness.weights("best"),
        tags.TRAINING_RUN: "none",  # trained without MLflow
        tags.DATA_DIR: str(harness.data.resolve()),
        tags.TASK_REF: "tabular",
        tags.TASK_NAME: "tabular",
        tags.TASK_OPTIONS: '{"hidden_width":128}',  # as given to the training: the rest are defaults
        tags.TASK_FILE_SHA256: "none",
        tags.GATE_ACCEPTED: "true",
        tags.GATE_CHAMPION: "2",
        tags.REPLACED_VERSION: "2",
    }
    assert {key: info.tags.get(key) for key in expected} == expected
    assert float(info.tags["retrain.metric.macro_f1"]) > float(
        harness.registry.version("history", "2").tags["retrain.metric.macro_f1"]
    )
    assert json.loads(info.tags[tags.GATE_REASONS])[0].startswith("macro_f1 ")
    assert info.tags[tags.EVALUATED_ON].endswith("test (188 rows)")


def test_models_lists_versions_with_aliases_metrics_and_lineage(harness: Harness, capsys):
    code, out, _ = run(harness, capsys, "models", "--model-name", "history", "--json")
    assert code == 0
    listing = json.loads(out)
    assert listing["aliases"] == {CHAMPION: "3", PREVIOUS: "2"}
    assert [version["version"] for version in listing["versions"]] == ["3", "2", "1"]
    newest = listing["versions"][0]
    assert newest["aliases"] == [CHAMPION]
    assert newest["lineage"]["trigger"]["event_id"] == "evt-best"
    assert newest["lineage"]["pipeline_job"] == "run-history-3"
    assert 0.9 < newest["metrics"]["macro_f1"] <= 1.0

    code, out, _ = run(harness, capsys, "models", "--model-name", "history")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["VERSION", "ALIASES", "MACRO_F1"]
    assert lines[1].split()[:2] == ["v3", "champion"] and lines[2].split()[:2] == ["v2", "previous"]
    assert f"{RAW_VERSION} -> dv-" in lines[1] and "blob evt-best" in lines[1] and "run-history-3" in lines[1]


def test_models_of_an_unregistered_name_says_so(harness: Harness, capsys):
    code, out, _ = run(harness, capsys, "models", "--model-name", "nothing-here")
    assert (code, out) == (0, "nothing-here: no registered versions\n")


def test_lineage_walks_from_the_version_to_its_trigger_and_data_manifest(harness: Harness, capsys):
    code, out, _ = run(harness, capsys, "lineage", "2", "--model-name", "history")
    assert code == 0
    manifest = harness.data / "manifest.json"
    data_version = json.loads(manifest.read_text())["data_version"]
    lines = out.splitlines()
    assert lines[0].startswith("history v2 (previous), registered ")
    assert lines[1].startswith("  gate       accepted: macro_f1 ") and "beats champion v1's" in lines[1]
    assert lines[2:6] == [
        "  pipeline   run-history-2",
        "  trigger    kind blob, event id evt-strong (event_id=evt-strong,kind=blob)",
        f"  code       {' '.join(code_version())}; environment 7",
        f"  data       raw {RAW_VERSION} -> prepared {data_version}",
    ]
    assert lines[6] == f"  manifest   {manifest.resolve()} (sha256 {file_sha256(manifest)}, verified)"
    assert any(line.startswith("    raw file batch-0001.csv: ") for line in lines)
    parts = len(json.loads(manifest.read_text())["parts"])
    assert f"    split test: 188 rows in {parts} parts" in lines
    assert lines[-1] == '  task       tabular options {"hidden_width": 64}'


def test_lineage_reaches_the_manifest_copy_in_the_models_artifacts_when_the_data_is_gone(
    harness: Harness, capsys, tmp_path: Path
):
    data = tmp_path / "prepared"
    shutil.copytree(harness.data, data)  # the same data version, in a folder a cache cleanup will delete
    evaluation = harness.evaluate("mid", "cleaned")
    assert harness.register("mid", evaluation, "cleaned", data=data)["registered_version"] == "1"
    shutil.rmtree(data)

    code, out, _ = run(harness, capsys, "lineage", "1", "--model-name", "cleaned", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["manifest"]["location"] == "models:/cleaned/1/artifacts/manifest.json"
    assert report["manifest"]["sha256"] == file_sha256(harness.data / "manifest.json")
    assert [entry["name"] for entry in report["manifest"]["raw_files"]] == [
        f"batch-000{number}.csv" for number in range(1, 5)
    ]
    assert report["lineage"]["manifest"]["path"] == str((data / "manifest.json").resolve())


def test_lineage_of_a_missing_version_is_one_line(harness: Harness, capsys):
    code, _, err = run(harness, capsys, "lineage", "9", "--model-name", "history")
    assert code == 2
    assert err == (
        "retrain: error: model 'history' has no version '9'; "
        "`retrain models --model-name history` lists its versions\n"
    )


def test_rollback_moves_champion_back_step_by_step_and_records_why(harness: Harness, capsys):
    for model in HISTORY:
        harness.evaluate_and_register(model, "rolling")
    locks = ["--lock", str(harness.root / "locks")]

    code, out, _ = run(
        harness, capsys, "rollback", "--model-name", "rolling", "--reason", "bad in production", *locks
    )
    assert code == 0
    assert out == "rolling: champion v3 -> v2; previous: v1; reason: bad in production\n"
    assert harness.registry.aliases("rolling") == {CHAMPION: "2", PREVIOUS: "1"}
    rolled_back = harness.registry.version("rolling", "3").tags
    assert rolled_back[tags.ROLLBACK_REASON] == "bad in production"
    assert rolled_back[tags.ROLLBACK_TO] == "2"
    assert rolled_back[tags.ROLLBACK_AT].startswith("20")

    code, out, _ = run(harness, capsys, "rollback", "--model-name", "rolling", "--reason", "v2 too", *locks)
    assert out == "rolling: champion v2 -> v1; previous: none; reason: v2 too\n"
    assert harness.registry.aliases("rolling") == {CHAMPION: "1"}

    code, _, err = run(harness, capsys, "rollback", "--model-name", "rolling", "--reason", "v1 too", *locks)
    assert code == 2
    assert err == (
        "retrain: error: model 'rolling' has no 'previous' version to roll back to; its champion is v1\n"
    )
    assert harness.registry.aliases("rolling") == {CHAMPION: "1"}

    # The registry goes on from the restored champion: a new candidate is compared with v1.
    record = harness.evaluate_and_register("best", "rolling")
    assert record["decision"]["champion_version"] == "1" and record["registered_version"] == "4"
    assert harness.registry.aliases("rolling") == {CHAMPION: "4", PREVIOUS: "1"}


def test_rollback_without_a_champion_is_refused(harness: Harness, capsys):
    code, _, err = run(
        harness,
        capsys,
        "rollback",
        "--model-name",
        "nothing-here",
        "--reason",
        "x",
        "--lock",
        str(harness.root),
    )
    assert code == 2
    assert err == "retrain: error: model 'nothing-here' has no champion; there is nothing to roll back\n"


def test_without_model_name_the_one_registered_model_is_meant_and_several_are_refused(capsys, tmp_path: Path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'registry.db'}"
    client = MlflowClient(uri, uri)
    client.create_registered_model("houses")
    capsys.readouterr()  # MLflow's own lines as it creates the database
    code = main(["models", "--json", "--mlflow-tracking-uri", uri])
    assert code == 0 and json.loads(capsys.readouterr().out)["model_name"] == "houses"  # the only one

    client.create_registered_model("digits")
    for argv in (["models"], ["lineage", "1"], ["rollback", "--reason", "test"]):
        code = main([*argv, "--mlflow-tracking-uri", uri])
        err = capsys.readouterr().err.strip()
        assert code == 2, argv
        expected = "2 models are registered (digits, houses); expected --model-name NAME, one of them"
        assert err == f"retrain: error: {expected}"
    assert not client.get_registered_model("houses").aliases  # nothing changed: no rollback happened
