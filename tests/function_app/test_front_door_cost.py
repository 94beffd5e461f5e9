"""Every submission through the front door is estimated before it is sent: the estimate is in the ledger
before the submitter is called (so a failed submission still shows what it was about to spend), in the
job's tags, in the answer to GET /api/retrain/{id}, and in one log line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers.function_app.corpus import blob_created

from components.azureml.builder import DEFAULT_DATASTORE
from components.azureml.dry_run import DryRunSubmitter
from components.errors import SpecError
from components.request import COMPLETED, Submitter
from function_app.ledger.records import SUBMITTING
from function_app.service import FrontDoor
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

# 2 h of training on the spot cluster, one eviction per node every 4 h (0.5 expected), a save every
# half hour (0.25 h lost per eviction) and 0.25 h to restart: 2.25 wall hours on 1 GPU, at 40 % of 3.00.
COST = {
    "RETRAIN_GPU_HOUR_PRICE": "3.00",
    "RETRAIN_EXPECTED_TRAIN_HOURS": "2",
    "RETRAIN_MTBE_HOURS": "4",
    "RETRAIN_CHECKPOINT_EVERY_HOURS": "0.5",
    "RETRAIN_RESTART_OVERHEAD_HOURS": "0.25",
}
SUMMARY = (
    "estimated cost 2.70: 1 GPU(s) x 2.25 h on low-priority compute gpu-spot = 2.25 GPU-hours "
    "(0.50 expected evictions; spot pays: 55% cheaper than dedicated)"
)
TAGS = {
    "retrain.estimated_gpus": "1",
    "retrain.train_tier": "low_priority",
    "retrain.estimated_wall_hours": "2.25",
    "retrain.estimated_gpu_hours": "2.25",
    "retrain.cost_vs_dedicated": "0.450",
    "retrain.estimated_cost": "2.70",
}


def _front_door(home: Path, app_settings, submitter: Submitter | None = None) -> FrontDoor:
    environ = app_settings(home, **COST)
    front = build_front_door(AppSettings.from_environ(environ), environ, submitter=submitter)
    front.deliver(blob_created())
    return front


def test_a_submission_records_its_estimate_and_sends_it_in_the_jobs_tags(tmp_path, app_settings, caplog):
    front = _front_door(tmp_path / "home", app_settings)

    with caplog.at_level(logging.INFO, logger="function_app.flush"):
        [record] = front.flush(ignore_quiet=True)

    assert record.status == COMPLETED
    assert record.estimate["summary"] == SUMMARY
    assert record.estimate["cost"] == pytest.approx(2.70)
    assert front.ledger.submission(record.id) == record
    recorded = DryRunSubmitter(tmp_path / "home", datastore=DEFAULT_DATASTORE, registered_components=True)
    tags = recorded.job_document(record.job_name)["tags"]
    assert {key: tags[key] for key in TAGS} == TAGS
    assert tags["trigger.submission"] == record.id  # the trigger's own tags are still there
    assert front.describe(record.id)["estimate"]["summary"] == SUMMARY
    assert f"submission {record.id} of {record.raw_version}: {SUMMARY}" in caplog.messages


def test_the_estimate_is_in_the_ledger_even_when_the_submission_then_fails(tmp_path, app_settings):
    # A real dry-run submitter whose pipeline file is missing: it fails inside submit(), after the front
    # door has handed it the request.
    failing = DryRunSubmitter(tmp_path / "home", pipeline_file=tmp_path / "missing" / "pipeline.yml")
    front = _front_door(tmp_path / "home", app_settings, submitter=failing)

    with pytest.raises(SpecError):
        front.flush(ignore_quiet=True)

    [entry] = front.ledger_snapshot()["submissions"]
    assert (entry["status"], entry["job_name"]) == (SUBMITTING, None)  # the submitter never answered
    assert entry["estimate"]["summary"] == SUMMARY
