"""`retrain gc`: the pinned data nothing needs goes; what the ledger, a run in progress or the registry still
names stays, each asked where it lives (a real ledger folder, run store and MLflow registry on SQLite)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import retrain_cli
from components.data_version import check_pinned, snapshot_folder
from components.local.liveness import ProcessIdentity
from components.local.runs import RunRecord, RunStore, new_run_id
from components.request import COMPLETED, RUNNING
from function_app.events.triggers import KIND_BLOB
from function_app.ledger.ledger import open_ledger
from function_app.ledger.records import SubmissionRecord
from training.gate.lineage import RAW_DATA_VERSION
from training.mlflow_setup import mlflow_client

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


@pytest.fixture
def state(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("RETRAIN_HOME", str(tmp_path / "state"))
    for name in ("RETRAIN_LEDGER", "MLFLOW_TRACKING_URI", "RETRAIN_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "state"


def pin_versions(state: Path, tmp_path: Path, count: int) -> list[str]:
    """`count` versions of 'digits', oldest first, each with a batch file of its own."""
    landing = tmp_path / "landing"
    landing.mkdir()
    versions = []
    for number in range(1, count + 1):
        (landing / "batch.csv").write_text(f"row_key,label\nn{number},{number % 10}\n" * 40)
        manifest, folder = snapshot_folder(landing, state / "data" / "digits")
        os.utime(folder.with_name(f"{manifest.version}.manifest.json"), (number * 1000, number * 1000))
        versions.append(manifest.version)
    return versions


def submission(sid: str, status: str, version: str, updated: datetime) -> SubmissionRecord:
    return SubmissionRecord(sid, "digits", KIND_BLOB, status, T0, updated, raw_version=version)


def test_gc_keeps_what_the_ledger_a_running_run_and_the_registry_name_and_removes_the_rest(
    state: Path, tmp_path: Path, capsys
):
    v1, v2, v3, v4, v5, v6, v7 = pin_versions(state, tmp_path, 7)
    ledger = open_ledger(str(state / "ledger"))
    ledger.create_submission(submission("s-old", COMPLETED, v5, T0 + timedelta(minutes=1)))
    ledger.create_submission(submission("s-last", COMPLETED, v3, T0 + timedelta(minutes=2)))
    ledger.create_submission(submission("s-now", RUNNING, v2, T0 + timedelta(minutes=3)))
    created, folder = "2026-12-07T09:00:00+00:00", str(state / "data" / "digits" / v4)
    RunStore(state / "runs").create(
        RunRecord(
            new_run_id(created), "digits-job", "digits-key", "digits", v4, folder, created, steps=(),
            status=RUNNING, runner=ProcessIdentity.current(),
        )
    )  # fmt: skip
    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = mlflow_client(uri, registry_uri=uri)
    client.create_registered_model("digits")
    client.create_model_version("digits", (tmp_path / "model").as_uri(), tags={RAW_DATA_VERSION: v1})

    assert retrain_cli.main(["gc", "--keep", "1"]) == 0

    out = capsys.readouterr().out
    for version, why in (
        (v7, "among the 1 newest pins of digits"),
        (v4, "is Running"),
        (v3, "submission s-last, the last finished, is the next batch's basis"),
        (v2, "submission s-now is Running"),
        (v1, "registered as digits v1"),
    ):
        assert any(
            line.startswith("kept") and version in line and why in line for line in out.splitlines()
        ), out
        check_pinned(state / "data" / "digits" / version)
    removed = [line for line in out.splitlines() if line.startswith("removed")]
    assert len(removed) == 2 and v6 in removed[0] and v5 in removed[1]
    assert not (state / "data" / "digits" / v5).exists() and not (state / "data" / "digits" / v6).exists()
    assert "freed 2 stored file(s)" in out


def test_gc_refuses_to_keep_no_pin_and_removes_nothing(state: Path, tmp_path: Path, capsys):
    versions = pin_versions(state, tmp_path, 2)

    assert retrain_cli.main(["gc", "--keep", "0"]) == 2

    assert "--keep 0: expected a whole number of at least 1" in capsys.readouterr().err
    for version in versions:
        check_pinned(state / "data" / "digits" / version)
