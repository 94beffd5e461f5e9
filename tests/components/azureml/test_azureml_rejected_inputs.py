"""An Azure ML job's prepare step runs remotely: once the job has ended, its submitter's status carries the
raw files that step left out (its `rejected_inputs` output, read through the workspace seam), which the
front door records and never pins again (tests/function_app/test_rejected_inputs.py), and where its
prepared data version lies, which the model's next job builds on."""

from __future__ import annotations

import logging

import pytest
from helpers.components.azure_fakes import RecordingWorkspace

from components.azureml.submitter import AzureMLSubmitter
from components.azureml.workspace import JobRecord
from components.errors import SubmissionError
from components.outcome import PREPARED_KEY, REJECTED_KEY
from core.rejected_inputs import REPORT_FILE, REPORT_OUTPUT, RejectedFile, report_bytes

JOB = "retrain-digits-rd-a1b2c3d4e5f60718"
PREP = f"{JOB}-prep"
REASON = "missing column 'label'; expected the columns row_key, label, a (any order)"


def _workspace(
    status: str, prep_status: str = "Completed", report: bytes | None = None
) -> RecordingWorkspace:
    workspace = RecordingWorkspace()
    workspace.jobs[JOB] = JobRecord(JOB, status)
    workspace.children[JOB] = [
        JobRecord(PREP, prep_status, display_name="prep"),
        JobRecord(f"{JOB}-train", status, display_name="train"),
    ]
    if report is not None:
        workspace.outputs[(PREP, REPORT_OUTPUT, REPORT_FILE)] = report
    return workspace


@pytest.mark.parametrize("status", ["Completed", "Failed", "Canceled"])
def test_an_ended_jobs_status_says_which_raw_files_its_prep_left_out(status):
    workspace = _workspace(status, report=report_bytes([RejectedFile("bad.csv", REASON)]))

    submission = AzureMLSubmitter(workspace).status(JOB)

    assert submission.details[REJECTED_KEY] == [{"name": "bad.csv", "reason": REASON}]
    assert workspace.called("output_file") == [(PREP, REPORT_OUTPUT, REPORT_FILE)]


def test_a_running_job_is_not_asked_and_a_prep_without_a_report_reports_nothing():
    running = _workspace("Running", report=report_bytes([RejectedFile("bad.csv", REASON)]))
    assert REJECTED_KEY not in AzureMLSubmitter(running).status(JOB).details
    assert running.called("child_jobs") == [] and running.called("output_file") == []
    assert running.called("output_uri") == []

    failed_prep = _workspace("Failed", prep_status="Failed")
    assert REJECTED_KEY not in AzureMLSubmitter(failed_prep).status(JOB).details
    assert failed_prep.called("output_file") == [] and failed_prep.called("output_uri") == []

    every_file_fit = _workspace("Completed", report=report_bytes([]))
    assert AzureMLSubmitter(every_file_fit).status(JOB).details[REJECTED_KEY] == []


def test_an_unreadable_report_is_one_warning_and_costs_the_job_nothing(caplog):
    workspace = _workspace("Completed", report=b"\x00not json")
    caplog.set_level(logging.WARNING)

    submission = AzureMLSubmitter(workspace).status(JOB)

    assert submission.status == "Completed" and REJECTED_KEY not in submission.details
    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith(f"job {JOB}: the raw files its prep left out are not known: not JSON")


# Where run history says a step's output lies: the long form of a datastore path.
PREPARED = (
    "azureml://subscriptions/s/resourcegroups/rg/workspaces/ws/datastores/workspaceblobstore/paths/azureml/"
    "{}/prepared_data/"
)


def test_an_ended_jobs_status_says_where_its_prepared_data_lies_a_reused_steps_in_the_job_it_reused(caplog):
    workspace = _workspace("Completed", report=report_bytes([]))
    workspace.output_uris[(PREP, "prepared_data")] = PREPARED.format(PREP)

    assert AzureMLSubmitter(workspace).status(JOB).details[PREPARED_KEY] == PREPARED.format(PREP)

    # A prep step Azure ML reused ran nothing: its data is the reused job's.
    reused = {"azureml.isreused": "true", "azureml.reusedrunid": "earlier_prep_run"}
    workspace.children[JOB][0] = JobRecord(PREP, "Completed", display_name="prep", properties=reused)
    workspace.output_uris[("earlier_prep_run", "prepared_data")] = PREPARED.format("earlier_prep_run")
    assert AzureMLSubmitter(workspace).status(JOB).details[PREPARED_KEY] == PREPARED.format(
        "earlier_prep_run"
    )

    # Not known: nothing said; not readable: one warning, the job's status unchanged.
    assert PREPARED_KEY not in AzureMLSubmitter(_workspace("Completed")).status(JOB).details

    class Unreadable(RecordingWorkspace):
        def output_uri(self, job_name, output_name):
            raise SubmissionError(
                f"job {job_name!r}: where its output {output_name!r} lies could not be read"
            )

    unreadable = Unreadable(jobs=workspace.jobs, children=_workspace("Completed").children)
    caplog.set_level(logging.WARNING)
    submission = AzureMLSubmitter(unreadable).status(JOB)
    assert submission.status == "Completed" and PREPARED_KEY not in submission.details
    [line] = [record.getMessage() for record in caplog.records]
    assert line == (
        f"job {JOB}: where its prepared data lies is not known: job '{PREP}': where its output "
        "'prepared_data' lies could not be read"
    )
