"""The evaluate and register steps: scores tied to the exact weights and data version, lineage recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import NO_TRACKING, SMALL_RUN

from training.cli import main
from training.errors import InputError
from training.evaluate import EVALUATION_FILE, evaluate_candidate, load_trained_model
from training.prepare import prepare
from training.register import REGISTRATION_FILE, registration_record
from training.sample_data import write_sample_batches


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
    assert main(["train", *arguments, *SMALL_RUN, *NO_TRACKING, "--progress", "none"]) == 0
    return root / "model"


def test_evaluation_scores_the_candidate_on_its_own_test_split(trained: Path, prepared_data: Path, tmp_path):
    assert (
        main(["evaluate", "--model", str(trained), "--data", str(prepared_data), "--out", str(tmp_path)]) == 0
    )
    evaluation = json.loads((tmp_path / EVALUATION_FILE).read_text())
    metadata = json.loads((trained / "metadata.json").read_text())
    assert evaluation["candidate"]["weights_sha256"] == metadata["weights_sha256"]
    assert evaluation["data_version"] == metadata["data_version"]
    assert (evaluation["split"], evaluation["rows"]) == ("test", 188)
    assert 0.8 < evaluation["metrics"]["accuracy"] <= 1.0  # digits is easy; a broken model scores ~0.1
    assert evaluation["metrics"]["loss"] > 0


def test_tampered_weights_are_refused(trained: Path, prepared_data: Path, tmp_path: Path):
    copy = tmp_path / "model"
    shutil.copytree(trained, copy)
    payload = torch.load(copy / "model.pt", weights_only=True)
    first = next(key for key in payload["state_dict"] if key.endswith("weight"))
    payload["state_dict"][first] += 0.01
    torch.save(payload, copy / "model.pt")
    with pytest.raises(InputError, match="does not match the weights_sha256"):
        load_trained_model(copy)


def test_a_candidate_is_not_scored_on_another_data_version(trained: Path, tmp_path: Path):
    batches = write_sample_batches(tmp_path / "raw", batches=4)
    batches[-1].unlink()  # fewer rows: another data version
    prepare(tmp_path / "raw", tmp_path / "other")
    with pytest.raises(InputError, match="evaluate on the data version it was trained on"):
        evaluate_candidate(trained, tmp_path / "other")


def test_registration_records_lineage_from_trigger_to_metrics(trained: Path, prepared_data: Path, tmp_path):
    evaluation = tmp_path / "evaluation"
    main(["evaluate", "--model", str(trained), "--data", str(prepared_data), "--out", str(evaluation)])
    out = tmp_path / "registration"
    arguments = ["--model", str(trained), "--evaluation", str(evaluation), "--model-name", "digits"]
    assert main(["register", *arguments, "--trigger", "blob:batch-5.csv", "--out", str(out)]) == 0
    record = json.loads((out / REGISTRATION_FILE).read_text())
    metadata = json.loads((trained / "metadata.json").read_text())
    assert record["model_name"] == "digits"
    assert record["candidate"]["weights_sha256"] == metadata["weights_sha256"]
    assert record["lineage"]["trigger"] == "blob:batch-5.csv"
    assert record["lineage"]["data_version"] == metadata["data_version"]
    assert record["metrics"] == json.loads((evaluation / EVALUATION_FILE).read_text())["metrics"]


def test_an_evaluation_of_other_weights_is_refused(trained: Path, prepared_data: Path, tmp_path: Path):
    evaluation = tmp_path / "evaluation"
    main(["evaluate", "--model", str(trained), "--data", str(prepared_data), "--out", str(evaluation)])
    document = json.loads((evaluation / EVALUATION_FILE).read_text())
    document["candidate"]["weights_sha256"] = "0" * 64
    (evaluation / EVALUATION_FILE).write_text(json.dumps(document))
    with pytest.raises(InputError, match="evaluate the model being registered"):
        registration_record(trained, evaluation, "digits", "manual", None)
    arguments = ["--model", str(trained), "--evaluation", str(evaluation), "--model-name", "digits"]
    assert main(["register", *arguments, "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out" / REGISTRATION_FILE).exists()
