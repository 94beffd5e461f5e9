"""Nothing waits forever on something dead (issue 20, item 1 and part of 15).

A local-submitter flush is SIGKILLed while its `train` step runs (its whole process tree; or the flush
alone, which leaves the step running): the next flush finds the run's runner gone, fails the submission,
returns its claims to pending once, and submits them again; that run completes. `retrain runs` shows the
killed run Abandoned, and its staging folder goes once no process of it is left.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import signal
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest
from azure.storage.blob import BlobLeaseClient
from helpers.function_app.corpus import EVENT_GRID, PREFIX, blob_created
from helpers.function_app.flush_harness import JobBoard
from helpers.function_app.front_door_settings import app_settings
from helpers.function_app.liveness_harness import flush, front_door, gate_of, write_pipeline

from components.errors import JobNotFound
from components.local.cache import STAGING_PREFIX
from components.local.runs import ABANDONED, RunStore
from components.local.staging import sweep_staging
from components.request import RunRequest, Submission
from function_app.flush import STUCK_FLUSH_LEASE_SECONDS
from function_app.pinning import content_etag
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

START_TIMEOUT_S = 120.0


def _start_killable_flush(environ: dict[str, str], pipeline: Path) -> tuple[multiprocessing.Process, int]:
    """A flush in a fresh process, once its step has started; and the step's pid. Fails at once if the
    flush ends before its step starts."""
    process = multiprocessing.get_context("spawn").Process(target=flush, args=(environ, str(pipeline)))
    process.start()
    # Opened read-write, the FIFO never reads as ended before the step writes: select waits for the line,
    # or for the flush process to end (its sentinel), whichever comes first.
    fifo = os.open(gate_of(pipeline) / "started", os.O_RDWR)
    try:
        ready, _, _ = select.select([fifo, process.sentinel], [], [], START_TIMEOUT_S)
        assert fifo in ready, f"the flush ended (exit {process.exitcode}) or hung before its step started"
        return process, int(os.read(fifo, 64))
    finally:
        os.close(fifo)


@pytest.mark.parametrize("kill", ["the whole tree", "the flush alone"])
def test_a_local_flush_killed_while_train_runs_is_failed_by_the_next_which_trains_its_items(tmp_path, kill):
    pipeline = write_pipeline(tmp_path / "pipeline")
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "batch-1.csv").write_text("1\n")
    home = tmp_path / "home"
    environ = app_settings(home, RETRAIN_SUBMITTER="local", RETRAIN_LANDING_FOLDER=str(landing))
    event = blob_created(
        EVENT_GRID, f"{PREFIX}/batch-1.csv", eTag=content_etag(landing / "batch-1.csv"), contentLength=2
    )
    assert front_door(environ, pipeline).deliver(event, "blob").decision == "debounced"

    process, step_pid = _start_killable_flush(environ, pipeline)
    step = psutil.Process(step_pid)
    process.kill()
    process.join()
    if kill == "the whole tree":
        step.kill()
        step.wait()
    assert process.exitcode == -signal.SIGKILL
    runs = RunStore(home / "runs")
    staging = sorted((home / "cache" / "train").glob(f"{STAGING_PREFIX}*"))
    assert len(staging) == 1  # the killed step's outputs, never renamed into place

    door = front_door(environ, pipeline)
    dead_id = door.ledger.load_state("digits")[0].in_flight_id
    [submitted] = door.flush(ignore_quiet=True)

    dead = door.ledger.submission(dead_id)
    assert dead.status == "Failed" and "abandoned during step 'train'" in dead.details["reason"]
    assert "ended before the run did" in dead.details["reason"]
    assert submitted.status == "Completed" and submitted.events == dead.events  # its claims, once
    assert submitted.id != dead_id and door.ledger.claims("digits") == []
    state, _ = door.ledger.load_state("digits")
    assert (state.in_flight_id, state.last_outcome, state.runs_today) == (None, "Completed", 2)
    newer, killed = runs.list()
    assert (killed.status, killed.step("train").status, newer.status) == (ABANDONED, ABANDONED, "Completed")
    assert killed.runner is not None and killed.runner.pid == process.pid
    assert Path(newer.outputs["model"], "model.txt").read_text() == "trained on batch-1.csv"
    assert door.flush(ignore_quiet=True) == []  # nothing in flight, nothing pending

    if kill == "the flush alone":
        # The step outlived its runner: its staging folder is still its own until it ends.
        assert step.is_running() and staging[0].is_dir()
        step.kill()
        step.wait()
        assert sweep_staging(home / "cache", runs) == staging
    assert not staging[0].exists()
    assert [os.fspath(path) for path in (home / "cache" / "train").glob(f"{STAGING_PREFIX}*")] == []


class _JobService:
    """Azure ML's job service at the Submitter seam: jobs stay Running until they are deleted."""

    def __init__(self) -> None:
        self.jobs: dict[str, str] = {}

    def submit(self, request: RunRequest) -> Submission:
        self.jobs[request.job_name()] = request.run_key
        return self.status(request.job_name())

    def status(self, job_name: str) -> Submission:
        if job_name not in self.jobs:
            raise JobNotFound(f"job {job_name!r}: not found in the workspace")
        return Submission(job_name, "job-service", "Running", self.jobs[job_name])


def _ledgers(tmp_path: Path, azurite) -> dict[str, dict[str, str]]:
    container = azurite.new_container().container_name
    return {
        "local": {},
        "azurite": {
            "RETRAIN_LEDGER": f"{azurite.blob_endpoint}/{container}/ledger",
            "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string,
        },
    }


@pytest.mark.parametrize("store", ["local", "azurite"])
def test_a_job_in_flight_that_the_submitter_no_longer_has_is_failed_and_its_items_go_again(
    tmp_path, azurite, store
):
    environ = app_settings(tmp_path / "home", **_ledgers(tmp_path, azurite)[store])
    jobs = _JobService()
    door = build_front_door(AppSettings.from_environ(environ), environ, submitter=jobs)
    door.deliver(blob_created(EVENT_GRID, f"{PREFIX}/batch-1.csv"), "blob")
    [first] = door.flush(ignore_quiet=True)
    assert first.status == "Running" and door.flush(ignore_quiet=True) == []  # waits for it, rightly

    del jobs.jobs[first.job_name]  # deleted in the workspace, or lost
    [second] = door.flush(ignore_quiet=True)

    gone = door.ledger.submission(first.id)
    assert gone.status == "Failed" and gone.details["reason"].startswith("the job is gone: job ")
    assert second.status == "Running" and second.events == first.events and second.id != first.id
    assert door.ledger.claims("digits") == []


@pytest.mark.parametrize("store", ["local", "azurite"])
def test_a_start_recorded_by_a_clock_ahead_is_saved_as_now_by_the_next_flush(tmp_path, azurite, store):
    settings = {**_ledgers(tmp_path, azurite)[store], "RETRAIN_COOLDOWN_SECONDS": "3600"}
    environ = app_settings(tmp_path / "home", **settings)
    board = tmp_path / "board"
    ahead = datetime.now(UTC) + timedelta(days=2)
    fast = build_front_door(
        AppSettings.from_environ(environ), environ, submitter=JobBoard(board), clock=lambda: ahead
    )
    fast.deliver(blob_created(EVENT_GRID, f"{PREFIX}/batch-1.csv"), "blob")
    assert [s.status for s in fast.flush(ignore_quiet=True)] == ["Completed"]
    door = build_front_door(AppSettings.from_environ(environ), environ, submitter=JobBoard(board))
    door.deliver(blob_created(EVENT_GRID, f"{PREFIX}/batch-2.csv", eTag="0x8DC2"), "blob")

    assert door.flush(ignore_quiet=True) == []

    state, _ = door.ledger.load_state("digits")
    assert state.last_submission_at <= datetime.now(UTC) < ahead  # saved once, clamped to this clock
    assert 3500 < door.verdicts()["digits"].retry_after_seconds <= 3600  # not 2 days and an hour


def _refused_flush_reason(environ: dict[str, str], board: Path, clock) -> str:
    """What a flush at `clock`'s time says while this process holds the model's flush lease."""
    settings = AppSettings.from_environ(environ)
    other = build_front_door(settings, environ, submitter=JobBoard(board), clock=clock)
    assert other.flush(ignore_quiet=True) == []
    return other.verdicts()["digits"].reason


@pytest.mark.parametrize("store", ["local", "azurite"])
def test_a_refused_flush_names_the_lease_holder_and_its_age_and_a_blob_lease_held_too_long_is_stuck(
    tmp_path, azurite, store, caplog
):
    environ = app_settings(tmp_path / "home", **_ledgers(tmp_path, azurite)[store])
    door = build_front_door(AppSettings.from_environ(environ), environ, submitter=JobBoard(tmp_path / "b"))
    door.deliver(blob_created(EVENT_GRID, f"{PREFIX}/batch-1.csv"), "blob")
    before = datetime.now(UTC)
    with door.ledger.flush_lease("digits") as held:  # another flush, hung
        after = datetime.now(UTC)
        assert held is not None
        hours_later = after + timedelta(hours=2)
        reason = _refused_flush_reason(environ, tmp_path / "b", lambda: hours_later)

    assert f"held by pid {os.getpid()} on {socket.gethostname()} for " in reason
    age = int(reason.split(" for ", 1)[1].split(" s", 1)[0])
    assert 7200 - 1 <= age <= 7200 + (after - before).total_seconds() + 1  # since: when it was taken
    stuck = "longer than any flush takes (600 s)" in reason and "break the lease" in reason
    # A blob lease outlives a dead or hung holder; a file lock dies with its process, so a local holder
    # this old is a long run, never a stuck lease.
    assert stuck is (store == "azurite")
    assert door.ledger.claims("digits")  # nothing taken by the refused flush
    with door.ledger.flush_lease("digits") as again:
        assert again is not None and door.ledger.flush_holder("digits") is not None
    assert door.ledger.flush_holder("digits") is None  # released: nobody holds it


def test_an_infinite_lease_on_the_flush_blob_is_reported_with_how_to_break_it_and_breaking_it_frees_the_model(
    tmp_path, azurite
):
    container = azurite.new_container()
    environ = app_settings(
        tmp_path / "home",
        RETRAIN_LEDGER=f"{azurite.blob_endpoint}/{container.container_name}/ledger",
        RETRAIN_STORAGE_CONNECTION_STRING=azurite.connection_string,
    )
    door = build_front_door(AppSettings.from_environ(environ), environ, submitter=JobBoard(tmp_path / "b"))
    door.deliver(blob_created(EVENT_GRID, f"{PREFIX}/batch-1.csv"), "blob")
    with door.ledger.flush_lease("digits"):
        pass  # the lease blob exists once a flush has held it
    by_hand = BlobLeaseClient(container.get_blob_client("ledger/leases/flush-digits"))
    by_hand.acquire(lease_duration=-1)  # what `az storage blob lease acquire` without a duration takes

    reason = _refused_flush_reason(environ, tmp_path / "b", lambda: datetime.now(UTC))

    assert "an infinite lease, which no flush takes" in reason
    assert "README, 'A flush lease that never frees', says how to break it" in reason
    # The entry that says how lives in the troubleshooting page now (the message still says README).
    troubleshooting = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    assert "## A flush lease that never frees" in troubleshooting
    assert door.ledger.claims("digits")
    by_hand.break_lease(lease_break_period=0)  # the troubleshooting page's way through
    assert [s.status for s in door.flush(ignore_quiet=True)] == ["Completed"]


def test_a_flush_lease_is_called_stuck_only_past_twice_the_hosts_function_timeout():
    host = json.loads((Path(__file__).resolve().parents[2] / "host.json").read_text())
    hours, minutes, seconds = (int(part) for part in host["functionTimeout"].split(":"))
    assert 2 * (3600 * hours + 60 * minutes + seconds) == STUCK_FLUSH_LEASE_SECONDS
