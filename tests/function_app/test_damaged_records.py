"""One damaged ledger record costs that record, never its model (function_app/ledger/): a claim, submission
or model state that cannot be read, or a stray file among a model's claims, is moved aside to
`quarantine/` with a warning naming it; flushes, deliveries and `retrain ledger` go on with the rest; a
damaged model state is rebuilt from the submissions it summarises. Each case runs on the local ledger and
on a ledger in Azurite, through the front door the Functions host starts, submitting to the flush
harness's job board (nothing trains)."""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from azure.storage.blob import ContainerClient
from helpers.function_app.corpus import EVENT_GRID, PREFIX, blob_created
from helpers.function_app.flush_harness import front_door
from helpers.function_app.front_door_settings import app_settings

from components.data_version import DataManifest
from components.errors import JobNotFound
from components.request import COMPLETED, RUNNING, RunRequest, Submission
from function_app.ledger.ledger import Ledger, open_ledger
from function_app.ledger.store import QUARANTINE, BlobRecordStore, LocalRecordStore, quarantine_name
from function_app.local.cli import register_commands
from function_app.service import FrontDoor
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

MODEL = "digits"


@dataclass
class Raw:
    """A ledger's records as bytes, below the record store: where damage is done."""

    get: Callable[[str], bytes]
    put: Callable[[str, bytes], None]
    local: bool


@pytest.fixture(params=["local", "azurite"])
def ledger_at(request, tmp_path, azurite) -> Iterator[tuple[dict[str, str], Raw]]:
    home = tmp_path / "home"
    if request.param == "local":
        folder = home / "ledger"

        def put(name: str, data: bytes) -> None:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)

        yield app_settings(home), Raw(lambda name: (folder / name).read_bytes(), put, True)
        return
    container = azurite.new_container()
    environ = app_settings(
        home,
        RETRAIN_LEDGER=f"{azurite.blob_endpoint}/{container.container_name}/retrain",
        RETRAIN_STORAGE_CONNECTION_STRING=azurite.connection_string,
    )
    yield (
        environ,
        Raw(
            lambda name: container.download_blob(f"retrain/{name}").readall(),
            lambda name, data: container.upload_blob(f"retrain/{name}", data, overwrite=True),
            False,
        ),
    )
    container.delete_container()


def _deliver(door: FrontDoor, *names: str) -> list[str]:
    """Blob-created events for `names`; their claims' record ids."""
    outcomes = [
        door.deliver(blob_created(EVENT_GRID, f"{PREFIX}/{name}", eTag=f"0x{n:X}"), "blob")
        for n, name in enumerate(names, 1)
    ]
    assert all(outcome.decision in ("accepted", "debounced") for outcome in outcomes)
    return [outcome.record_id for outcome in outcomes]


def _ledger_command(environ: dict[str, str], capsys) -> tuple[int, list[str]]:
    parser = argparse.ArgumentParser(prog="retrain")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["ledger"])
    args.environ, args.state_root = environ, Path(environ["RETRAIN_HOME"])
    code = args.handler(args)
    return code, capsys.readouterr().out.splitlines()


def _open(environ: dict[str, str]) -> Ledger:
    return open_ledger(environ["RETRAIN_LEDGER"], environ.get("RETRAIN_STORAGE_CONNECTION_STRING"))


# What damage does to a claim's stored bytes (locally they start with the record store's tag line).
CLAIM_DAMAGE = {
    "truncated": lambda raw, local: raw[: len(raw) // 2],
    "empty": lambda raw, local: b"",
    "wrong schema": lambda raw, local: (b"#tag=\n" if local else b"") + b'{"hello": "world"}\n',
    "nul": lambda raw, local: b"\0" * len(raw),
}


@pytest.mark.parametrize("damage", list(CLAIM_DAMAGE))
def test_a_damaged_claim_is_moved_aside_and_the_other_claims_are_submitted(
    ledger_at, tmp_path, damage, capsys, caplog
):
    environ, raw = ledger_at
    put = raw.put
    door = front_door(environ, tmp_path / "board")
    bad, *good = _deliver(door, "a.csv", "b.csv", "c.csv")
    name = f"claims/{MODEL}/{bad}.json"
    put(name, CLAIM_DAMAGE[damage](raw.get(name), raw.local))

    caplog.set_level(logging.WARNING)
    [submitted] = door.flush(ignore_quiet=True)

    assert submitted.status == "Completed" and set(submitted.events) == set(good)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"ledger record {_open(environ).location.rstrip('/')}/{name} is unreadable" in warning
    assert "moved aside to" in warning and "\n" not in warning
    code, out = _ledger_command(environ, capsys)
    assert code == 0
    [moved] = _open(environ).snapshot()["quarantined"]
    assert moved.startswith(f"{QUARANTINE}/{name}.") and out[-2:] == ["quarantined (1):", f"  {moved}"]
    assert door.flush(ignore_quiet=True) == []  # nothing left behind that stops the model


def test_a_stray_file_among_the_claims_is_moved_aside(ledger_at, tmp_path, capsys):
    environ, raw = ledger_at
    put = raw.put
    door = front_door(environ, tmp_path / "board")
    claims = _deliver(door, "a.csv", "b.csv")
    put(f"claims/{MODEL}/notes.txt", b"remember to retrain\n")
    put(f"claims/{MODEL}/old/k-1.json", b"#tag=\n{}\n")

    [submitted] = door.flush(ignore_quiet=True)

    assert set(submitted.events) == set(claims)
    code, out = _ledger_command(environ, capsys)
    quarantined = _open(environ).snapshot()["quarantined"]
    assert code == 0 and len(quarantined) == 2 and out[-3] == "quarantined (2):"
    assert any("notes.txt" in name for name in quarantined) and any("/old/" in name for name in quarantined)


def test_a_truncated_last_submission_is_moved_aside_and_the_model_goes_on(ledger_at, tmp_path, capsys):
    environ, raw = ledger_at
    put = raw.put
    door = front_door(environ, tmp_path / "board")
    _deliver(door, "a.csv")
    [first] = door.flush(ignore_quiet=True)
    name = f"submissions/{first.id}.json"
    put(name, raw.get(name)[:40])

    later = _deliver(door, "b.csv")
    [second] = door.flush(ignore_quiet=True)

    assert second.status == "Completed" and list(second.events) == later
    code, _ = _ledger_command(environ, capsys)
    assert code == 0
    assert [s["id"] for s in _open(environ).snapshot()["submissions"]] == [second.id]
    assert [n.split("/")[1] for n in _open(environ).snapshot()["quarantined"]] == ["submissions"]


def test_a_truncated_submission_in_flight_fails_and_its_claims_go_into_the_next(ledger_at, tmp_path):
    environ, raw = ledger_at
    put = raw.put
    claims = _deliver(front_door(environ, tmp_path / "board"), "a.csv", "b.csv")

    def truncate_in_flight(step: str) -> None:
        if step == "claims-taken":
            [name] = [e.name for e in _open(environ).store.list("submissions/")]
            put(name, raw.get(name)[:40])
            raise KeyboardInterrupt  # the flush dies here, leaving its submission in flight

    with pytest.raises(KeyboardInterrupt):
        front_door(environ, tmp_path / "board", on_step=truncate_in_flight).flush(ignore_quiet=True)

    records = front_door(environ, tmp_path / "board").flush(ignore_quiet=True)
    assert [r.status for r in records] == ["Completed"] and set(records[0].events) == set(claims)


def test_a_truncated_model_state_is_rebuilt_and_deliveries_go_on(ledger_at, tmp_path, caplog):
    environ, raw = ledger_at
    put = raw.put
    door = front_door(environ, tmp_path / "board")
    _deliver(door, "a.csv")
    [first] = door.flush(ignore_quiet=True)
    name = f"models/{MODEL}.json"
    before, _ = _open(environ).load_state(MODEL)
    put(name, raw.get(name)[:30])

    caplog.set_level(logging.WARNING)
    fresh = front_door(environ, tmp_path / "board")  # a new instance: no state cached
    later = _deliver(fresh, "b.csv")  # an event's delivery does not fail on it

    rebuilt, _ = _open(environ).load_state(MODEL)
    assert rebuilt.last_finished_id == first.id == before.last_finished_id
    assert rebuilt.runs_on(datetime.now(UTC)) == before.runs_on(datetime.now(UTC)) == 1
    assert rebuilt.in_flight_id is None and rebuilt.last_outcome == "Completed"
    assert any(f"{name} is unreadable" in r.getMessage() for r in caplog.records)
    [second] = fresh.flush(ignore_quiet=True)
    assert list(second.events) == later
    assert _open(environ).load_state(MODEL)[0].runs_on(datetime.now(UTC)) == 2


@pytest.mark.parametrize("kind", ["local", "azurite"])
def test_two_readers_moving_one_record_aside_at_once_keep_one_copy(kind, tmp_path, azurite):
    if kind == "local":
        open_store = lambda: LocalRecordStore(tmp_path / "ledger")  # noqa: E731
    else:
        name = azurite.new_container().container_name
        open_store = lambda: BlobRecordStore(  # noqa: E731
            ContainerClient.from_connection_string(azurite.connection_string, name), "retrain"
        )
    stores = [open_store(), open_store()]
    for round_ in range(10):
        record = f"claims/{MODEL}/k-{round_}.json"
        assert stores[0].create(record, b"{torn", "")
        version = stores[0].read(record).version
        barrier, moved = threading.Barrier(2), []

        def move(store, record: str, version: str, barrier: threading.Barrier, moved: list) -> None:
            barrier.wait(30)
            moved.append(store.quarantine(record, version))

        threads = [
            threading.Thread(target=move, args=(store, record, version, barrier, moved)) for store in stores
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        target = quarantine_name(record, version)
        assert moved == [target, target]
        assert stores[0].read(record) is None and stores[0].read(target).data.endswith(b"{torn")
    assert len(list(stores[0].list(f"{QUARANTINE}/"))) == 10


class RunningJobs:
    """Azure ML's job service at the Submitter seam: a job runs until the test ends it."""

    def __init__(self) -> None:
        self.status_of: dict[str, str] = {}

    def submit(self, request: RunRequest) -> Submission:
        name = request.job_name()
        if name not in self.status_of:  # Azure ML refuses a second job of one name: the first is returned
            self.status_of[name] = RUNNING
        return self.status(name)

    def status(self, job_name: str) -> Submission:
        if job_name not in self.status_of:
            raise JobNotFound(f"job {job_name!r}: not found")
        return Submission(job_name, "jobs", self.status_of[job_name], "")


def test_a_damaged_record_of_a_running_job_is_rebuilt_from_the_job_and_no_second_run_is_spent(
    ledger_at, tmp_path, caplog
):
    environ, raw = ledger_at
    jobs = RunningJobs()
    door = build_front_door(AppSettings.from_environ(environ), environ, submitter=jobs)
    first_claims = _deliver(door, "a.csv")
    [running] = door.flush(ignore_quiet=True)
    name = f"submissions/{running.id}.json"
    raw.put(name, raw.get(name)[:40])  # damaged while its job runs
    arrival = door.deliver(blob_created(EVENT_GRID, f"{PREFIX}/b.csv", eTag="0x2"), "blob")
    assert arrival.decision == "coalesced"  # it joins the next run, once this one has ended

    caplog.set_level(logging.WARNING)
    assert door.flush(ignore_quiet=True) == []  # the job still runs: nothing else is started

    assert list(jobs.status_of) == [running.job_name]
    rebuilt = _open(environ).submission(running.id)
    assert (rebuilt.status, rebuilt.job_name, rebuilt.raw_version) == (
        RUNNING,
        running.job_name,
        running.raw_version,
    )
    assert list(rebuilt.events) == first_claims
    assert DataManifest.from_json(rebuilt.details["manifest"]).version == running.raw_version
    assert any(
        f"submission {running.id} of {MODEL}: its record was unreadable; rebuilt" in r.getMessage()
        for r in caplog.records
    )
    state, _ = _open(environ).load_state(MODEL)
    assert (state.in_flight_id, state.runs_on(datetime.now(UTC))) == (running.id, 1)

    # Once it ends, the next batch builds on what it trained on, and only then starts.
    jobs.status_of[running.job_name] = COMPLETED
    [second] = door.flush(ignore_quiet=True)
    assert (
        list(second.events) == [arrival.record_id]
        and _open(environ).submission(running.id).status == COMPLETED
    )
    assert [file.name for file in DataManifest.from_json(second.details["manifest"]).files] == [
        "a.csv",
        "b.csv",
    ]
    assert _open(environ).load_state(MODEL)[0].runs_on(datetime.now(UTC)) == 2
