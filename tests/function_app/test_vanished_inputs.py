"""Landing data deleted or replaced after its event (function_app/flush.py, function_app/pinning.py): the
flush drops that file from the batch with one line naming it, records why on its claim (never retried),
and submits the rest; a batch with nothing left spends no budget. Run on a landing folder with the local
ledger, and on an Azurite container with the ledger in Azurite, both through the real pinners; the job
service is the flush harness's board (a submission completes at once, nothing trains)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers.function_app.corpus import PREFIX
from helpers.function_app.flush_harness import JobBoard, front_door
from helpers.function_app.front_door_settings import app_settings

from components.data_version import DataManifest
from function_app.flush import DROPPED
from function_app.ledger.ledger import open_ledger
from function_app.local.watch import BlobSource, ContainerSource, FolderSource, Watcher
from function_app.service import FrontDoor, utc_now
from function_app.settings.app import AppSettings, BlobScope

MODEL = "digits"


class Landing:
    """The landing data of one test: put, replace and delete files, and deliver their events as
    `retrain watch` would."""

    def __init__(
        self,
        put: Callable[[str, bytes], None],
        delete: Callable[[str], None],
        source: BlobSource,
        scope: BlobScope,
        home: Path,
    ) -> None:
        self.put, self.delete = put, delete
        self._source, self._scope, self._home = source, scope, home

    def deliver(self, door: FrontDoor) -> None:
        deliver = lambda event: door.deliver(event, "blob")  # noqa: E731
        Watcher(self._source, self._scope, self._home, deliver, utc_now).poll()


def _csv(rows: int) -> bytes:
    return ("row_key,label,a\n" + "".join(f"r{n},{n % 2},{n}\n" for n in range(rows))).encode()


@pytest.fixture(params=["folder", "azurite"])
def landing(request, tmp_path, azurite) -> tuple[dict[str, str], Landing]:
    """A landing folder with the local ledger, or an Azurite container with the ledger in Azurite."""
    home = tmp_path / "home"
    if request.param == "folder":
        folder = tmp_path / "landing"
        folder.mkdir()
        environ = app_settings(home, RETRAIN_SUBMITTER="local", RETRAIN_LANDING_FOLDER=str(folder))
        scope = AppSettings.from_environ(environ).models[0].scope
        return environ, Landing(
            lambda name, data: (folder / name).write_bytes(data),
            lambda name: (folder / name).unlink(),
            FolderSource(folder, scope),
            scope,
            home,
        )
    container, ledger = azurite.new_container(), azurite.new_container()
    request.addfinalizer(container.delete_container)
    request.addfinalizer(ledger.delete_container)
    environ = app_settings(
        home,
        RETRAIN_SUBMITTER="local",
        RETRAIN_BLOB_ACCOUNT=azurite.account,
        RETRAIN_BLOB_CONTAINER=container.container_name,
        RETRAIN_BLOB_ENDPOINT=azurite.blob_endpoint,
        RETRAIN_STORAGE_CONNECTION_STRING=azurite.connection_string,
        RETRAIN_LEDGER=f"{azurite.blob_endpoint}/{ledger.container_name}/retrain",
    )
    scope = AppSettings.from_environ(environ).models[0].scope
    return environ, Landing(
        lambda name, data: container.upload_blob(f"{PREFIX}/{name}", data, overwrite=True),
        lambda name: container.delete_blob(f"{PREFIX}/{name}"),
        ContainerSource(container, scope),
        scope,
        home,
    )


def test_a_vanished_landing_file_is_dropped_named_and_the_rest_trains(landing, tmp_path, caplog):
    environ, data = landing
    board = tmp_path / "board"
    door = front_door(environ, board)
    ledger = open_ledger(environ["RETRAIN_LEDGER"], environ.get("RETRAIN_STORAGE_CONNECTION_STRING"))
    for name, rows in (("a.csv", 3), ("b.csv", 4), ("e.csv", 5)):
        data.put(name, _csv(rows))
    data.deliver(door)
    data.delete("a.csv")  # cleaned up after its event
    data.put("b.csv", _csv(6))  # replaced; its own event has not come yet

    caplog.set_level(logging.WARNING)
    [first] = door.flush(ignore_quiet=True)  # no PinError, no storage error: the rest goes

    assert first.status == "Completed"
    assert [pin.url.rsplit("/", 1)[1] for pin in first.inputs] == ["e.csv"]
    assert [f.name for f in DataManifest.from_json(first.details["manifest"]).files] == ["e.csv"]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    [gone] = [line for line in lines if "a.csv" in line]
    [changed] = [line for line in lines if "b.csv" in line]
    assert "gone since its event" in gone and "changed since its event" in changed
    assert "AccountKey" not in " ".join(lines) and azurite_key(environ) not in " ".join(lines)
    dropped = {claim.record.reason for claim in ledger.claims(MODEL, tag=DROPPED)}
    assert len(dropped) == 2 and all(reason.startswith("dropped from the batch: ") for reason in dropped)
    assert {c.record.decision for c in ledger.claims(MODEL, tag=DROPPED)} == {"rejected"}
    assert ledger.claims(MODEL) == []  # nothing pending: a dropped claim is never retried

    # The replaced file's own event trains its new version, beside what is still there.
    data.deliver(door)
    [replaced] = door.flush(ignore_quiet=True)
    assert replaced.status == "Completed"
    assert [pin.url.rsplit("/", 1)[1] for pin in replaced.inputs] == ["b.csv"]
    assert [f.name for f in DataManifest.from_json(replaced.details["manifest"]).files] == ["b.csv", "e.csv"]

    # A batch whose every file vanished: recorded on its claim, no submission, no budget spent.
    data.put("c.csv", _csv(2))
    data.deliver(door)
    data.delete("c.csv")
    runs_before = ledger.load_state(MODEL)[0].runs_on(datetime.now(UTC))
    assert door.flush(ignore_quiet=True) == []
    assert "nothing left to submit" in door.verdicts()[MODEL].reason
    assert ledger.load_state(MODEL)[0].runs_on(datetime.now(UTC)) == runs_before
    assert len(ledger.claims(MODEL, tag=DROPPED)) == 3

    # A later upload trains, with what is still there.
    data.put("d.csv", _csv(7))
    data.deliver(door)
    [later] = door.flush(ignore_quiet=True)
    assert later.status == "Completed"
    names = [f.name for f in DataManifest.from_json(later.details["manifest"]).files]
    assert names == ["b.csv", "d.csv", "e.csv"]

    # A file an earlier run trained on, cleaned up since: the next run goes without it, saying so.
    data.delete("e.csv")
    data.put("f.csv", _csv(8))
    data.deliver(door)
    caplog.clear()
    [after_cleanup] = door.flush(ignore_quiet=True)
    names = [f.name for f in DataManifest.from_json(after_cleanup.details["manifest"]).files]
    assert names == ["b.csv", "d.csv", "f.csv"]
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "e.csv: gone since its event" in line
    submissions = ledger.snapshot()["submissions"]
    assert [s["status"] for s in submissions] == ["Completed"] * 4  # not one Failed
    assert len(JobBoard(board).jobs()) == 4
    assert ledger.load_state(MODEL)[0].runs_on(datetime.now(UTC)) == 4


def test_a_file_gone_between_the_check_and_the_pin_fails_one_submission_in_one_line(tmp_path, caplog):
    """The narrow race: the file is there when the batch is checked and gone when it is copied. That
    submission fails (one Failed, one run of the budget) naming the file; the next flush drops it."""
    folder = tmp_path / "landing"
    folder.mkdir()
    environ = app_settings(tmp_path / "home", RETRAIN_SUBMITTER="local", RETRAIN_LANDING_FOLDER=str(folder))
    board = tmp_path / "board"

    def delete_when_recorded(step: str) -> None:
        if step == "claims-taken":
            (folder / "a.csv").unlink(missing_ok=True)

    door = front_door(environ, board, on_step=delete_when_recorded)
    scope = door.settings.models[0].scope
    for name in ("a.csv", "b.csv"):
        (folder / name).write_bytes(_csv(3 if name == "a.csv" else 4))
    Landing(print, print, FolderSource(folder, scope), scope, tmp_path / "home").deliver(door)

    [failed] = door.flush(ignore_quiet=True)
    assert failed.status == "Failed"
    assert failed.details["reason"].startswith(f"landing file {folder / 'a.csv'}: gone since its event")
    [retried] = door.flush(ignore_quiet=True)
    assert retried.status == "Completed"
    assert [pin.url.rsplit("/", 1)[1] for pin in retried.inputs] == ["b.csv"]
    statuses = [s["status"] for s in open_ledger(environ["RETRAIN_LEDGER"]).snapshot()["submissions"]]
    assert statuses == ["Failed", "Completed"]


def azurite_key(environ: dict[str, str]) -> str:
    text = environ.get("RETRAIN_STORAGE_CONNECTION_STRING", "")
    return text.split("AccountKey=", 1)[1].split(";", 1)[0] if "AccountKey=" in text else "\0"
