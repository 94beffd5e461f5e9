"""The dry-run submitter: the validated job and its request, recorded under the state root; nothing run."""

from __future__ import annotations

import json

import pytest

from components.azureml.dry_run import DRY_RUN_DIR, DryRunSubmitter
from components.cost import CostSettings, with_estimate
from components.errors import SubmissionError
from components.request import COMPLETED, DataRef, RunRequest

VERSION = "rd-00112233445566ff"


def make_request(**changes) -> RunRequest:
    fields = {
        "model_name": "digits",
        "data": DataRef(VERSION, f"azureml:digits-raw:{VERSION}"),
        "trigger": {"source": "http"},
        "parameters": {"epochs": 2},
        "processes_per_instance": 2,
        "compute": {"train": "gpu-dedicated"},
    }
    return RunRequest(**{**fields, **changes})


# 2 GPUs on dedicated compute for 2 hours, at 2.5 a GPU-hour.
COST = CostSettings(gpu_hour_price=2.5, expected_train_hours=2.0)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    submitter = DryRunSubmitter(tmp_path_factory.mktemp("state"))
    request, _ = with_estimate(make_request(), COST)  # as `retrain submit` and the front door send it
    return submitter, submitter.submit(request)


def test_a_dry_run_records_the_validated_job_and_the_request(recorded):
    submitter, submission = recorded
    name = f"retrain-digits-{VERSION}"
    folder = submitter.root / name
    assert (submission.job_name, submission.backend, submission.status) == (name, "dry-run", COMPLETED)
    assert submission.run_key == f"digits-{VERSION}"
    assert submission.details["recorded"] == str(folder)
    assert sorted(path.name for path in folder.iterdir()) == ["job.yml", "request.json", "submission.json"]

    job = submitter.job_document(name)
    assert job["name"] == name
    assert job["jobs"]["train"]["compute"] == "azureml:gpu-dedicated"
    assert job["jobs"]["train"]["distribution"]["process_count_per_instance"] == 2
    assert job["inputs"]["raw_data"]["path"] == f"azureml:digits-raw:{VERSION}"
    assert job["inputs"]["epochs"] == 2
    request = json.loads((folder / "request.json").read_text())
    assert request["trigger"] == {"source": "http"}
    assert request["run_key"] == f"digits-{VERSION}"


def test_the_recorded_job_carries_the_estimate_in_its_tags(recorded):
    submitter, submission = recorded
    tags = submitter.job_document(submission.job_name)["tags"]
    assert tags == {
        "trigger.source": "http",
        "retrain.estimated_gpus": "2",
        "retrain.train_tier": "dedicated",
        "retrain.estimated_wall_hours": "2.00",
        "retrain.estimated_gpu_hours": "4.00",
        "retrain.cost_vs_dedicated": "1.000",
        "retrain.estimated_cost": "10.00",
        "retrain.model_name": "digits",
        "retrain.raw_version": VERSION,
        "retrain.run_key": f"digits-{VERSION}",
        "retrain.task": "tabular",
        "retrain.attempt": "0",
    }


def test_status_reads_the_record_back(recorded):
    submitter, submission = recorded
    again = DryRunSubmitter(submitter.root.parent).status(submission.job_name)
    assert (again.job_name, again.status, again.run_key) == (
        submission.job_name,
        COMPLETED,
        submission.run_key,
    )
    assert again.details["job_file"] == submission.details["job_file"]


def test_the_same_request_again_finds_the_record_instead_of_rewriting_it(recorded):
    submitter, submission = recorded
    job_file = submitter.root / submission.job_name / "job.yml"
    before = job_file.stat().st_mtime_ns

    again = submitter.submit(make_request(trigger={"source": "blob"}))

    assert again.job_name == submission.job_name
    assert again.details["duplicate"] is True
    assert job_file.stat().st_mtime_ns == before


def test_status_of_an_unknown_job_is_a_one_line_error(tmp_path):
    submitter = DryRunSubmitter(tmp_path)
    with pytest.raises(SubmissionError, match=r"dry run 'retrain-nope': not recorded under .*dry-runs"):
        submitter.status("retrain-nope")
    with pytest.raises(SubmissionError, match=r"job name '\.\./etc': expected 1-255 letters, digits"):
        submitter.status("../etc")


def test_a_request_that_does_not_build_leaves_nothing_behind(tmp_path):
    submitter = DryRunSubmitter(tmp_path)
    with pytest.raises(SubmissionError, match="parameter epochs='lots': expected an integer"):
        submitter.submit(make_request(parameters={"epochs": "lots"}))
    assert not (tmp_path / DRY_RUN_DIR).exists() or list((tmp_path / DRY_RUN_DIR).iterdir()) == []


def test_a_dry_run_record_holds_no_secret_of_the_request(tmp_path):
    submitter = DryRunSubmitter(tmp_path)
    secret = "Dry8unPw4Zk"
    request = make_request(
        parameters={"epochs": 2, "mlflow_tracking_uri": f"https://ops:{secret}@mlflow.example.com"},
        trigger={"source": "http", "note": f"token={secret}"},
    )
    folder = submitter.root / submitter.submit(request).job_name

    assert [path.name for path in folder.iterdir() if secret.encode() in path.read_bytes()] == []
    job = submitter.job_document(folder.name)
    assert job["jobs"]["train"]["inputs"]["mlflow_tracking_uri"] == "https://***@mlflow.example.com"
    assert json.loads((folder / "request.json").read_text())["trigger"]["note"] == "token=***"
