"""`retrain schedule`: a cron JobSchedule around the same pipeline, built and validated locally."""

from __future__ import annotations

import pytest
from helpers.components.azure_fakes import RecordingWorkspace

from components.azureml.builder import PipelineBuild
from components.azureml.schedule import (
    build_schedule,
    check_cron,
    create_schedule,
    scheduled_checkpoints_path,
)
from components.errors import SubmissionError


def make_build(**changes) -> PipelineBuild:
    fields = {
        "model_name": "digits",
        "data_uri": "azureml:digits-raw@latest",
        "checkpoints_path": scheduled_checkpoints_path("workspaceblobstore", "digits"),
        "tags": {"trigger.source": "schedule"},
        "trigger": "source=schedule",
        "processes_per_instance": 1,
        "instance_count": 2,
        "allow_latest_data": True,
    }
    return PipelineBuild(**{**fields, **changes})


@pytest.fixture(scope="module")
def schedule():
    return build_schedule("retrain-digits", "0  3 * * 1-5", "W. Europe Standard Time", make_build())


def test_the_schedule_carries_the_cron_trigger_and_its_name(schedule):
    document = schedule._to_dict()
    assert document["name"] == "retrain-digits"
    assert document["trigger"] == {
        "type": "cron",
        "expression": "0 3 * * 1-5",
        "time_zone": "W. Europe Standard Time",
    }
    assert document["tags"] == {"retrain.model_name": "digits", "retrain.schedule": "0 3 * * 1-5"}
    assert schedule._validate().passed


def test_the_scheduled_job_is_the_pipeline_with_per_firing_checkpoints(schedule):
    job = schedule._to_dict()["create_job"]
    assert job["type"] == "pipeline"
    assert "name" not in job  # each firing gets its own job name from Azure ML
    assert set(job["jobs"]) == {"prep", "train", "evaluate", "register"}
    assert job["inputs"]["raw_data"] == {"type": "uri_folder", "path": "azureml:digits-raw@latest"}
    assert job["jobs"]["train"]["resources"] == {"instance_count": 2}
    assert job["jobs"]["train"]["outputs"]["checkpoints"] == {
        "type": "uri_folder",
        "mode": "rw_mount",
        "path": "azureml://datastores/workspaceblobstore/paths/retrain/checkpoints/digits-scheduled/${{name}}/",
    }


def test_the_schedule_is_created_through_the_seam(schedule):
    workspace = RecordingWorkspace()
    record = create_schedule(workspace, schedule)
    assert workspace.calls == [("create_schedule", "retrain-digits")]
    assert workspace.sent == [schedule]
    assert record.name == "retrain-digits"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 3 * *", r"--cron '0 3 \* \*': 4 fields; expected 5 fields"),
        ("61 3 * * *", r"minute '61' is not \*, a number 0-59"),
        ("0 24 * * *", r"hour '24' is not \*, a number 0-23"),
        ("0 3 0 * *", r"day of month '0' is not"),
        ("0 3 * 1-13 *", r"month '1-13' is not"),
        ("0 3 * * 7", r"day of week '7' is not"),
        ("*/0 * * * *", r"minute '\*/0' is not"),
        ("5-1 * * * *", r"minute '5-1' is not"),
        ("@daily", r"1 fields; expected 5 fields"),
        ("0 3 * * MON", r"day of week 'MON' is not"),
    ],
)
def test_a_bad_cron_expression_is_a_one_line_error(expression, message):
    with pytest.raises(SubmissionError, match=message) as raised:
        check_cron(expression)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("expression", ["*/15 * * * *", "0 0,12 1-15/2 * 0-4", "30 2 * 6 6"])
def test_good_cron_expressions_pass(expression):
    assert check_cron(expression) == expression


def test_a_bad_time_zone_or_name_is_refused_before_building():
    with pytest.raises(SubmissionError, match=r"--time-zone 'CET': expected a Windows time zone name"):
        build_schedule("retrain-digits", "0 3 * * *", "CET", make_build())
    with pytest.raises(SubmissionError, match=r"--name 'nightly run': expected 1-255 letters"):
        build_schedule("nightly run", "0 3 * * *", "UTC", make_build())


def test_a_pinned_build_refuses_a_moving_data_target():
    with pytest.raises(
        SubmissionError, match=r"data 'azureml:digits-raw@latest': expected azureml:<asset>:<version> or"
    ):
        make_build(allow_latest_data=False)
