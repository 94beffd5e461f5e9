"""A bad input costs that input, never the model (issue 41, items 5 and 12).

A malformed landing file is left out by the run's prepare step, which names it; the front door records that
once, ends the file's claim `dropped` with the reason, and pins it into no later data version, so every
later upload trains and registers. A symbolic link in the local landing folder is never followed: the
watcher does not deliver it, and the pinner refuses one put in a file's place after its event.

The real pipeline runs (prep, a small training, evaluate, register) through the front door with the local
submitter; an Azure ML job's report comes back through its submitter's status, which a job board that plays
Azure ML's job service at the Submitter seam answers here.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from helpers.function_app.corpus import PREFIX
from helpers.function_app.flush_harness import front_door as board_front_door
from helpers.function_app.front_door_settings import app_settings

from components.data_version import DataFile, DataManifest
from components.outcome import PREPARED_KEY, REJECTED_KEY
from components.request import COMPLETED, QUEUED, RunRequest, Submission
from function_app.flush import DROPPED, PREVIOUS
from function_app.ledger.ledger import open_ledger
from function_app.local.watch import FolderSource, Watcher
from function_app.pinning import LandingFolderCopy, PinError, etag_of_bytes
from function_app.service import FrontDoor, utc_now
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door
from training.tasks.tabular.sample_data import write_sample_batches

MODEL = "digits"
# A small model and a short training, the gate open to any first model and to one at least as good.
MODEL_FILE = """\
[task]
ref = "tabular"

[task.options]
hidden_width = 32

[gate]
primary_metric = "accuracy"
min_improvement = 0.0
floors = {}
first_model_floors = {}
max_regression = {}

[pipeline]
epochs = 2
global_batch_size = 64
checkpoint_every_seconds = "off"

[trigger]
prefix = "digits"
"""
MALFORMED = b"row_key,label,pixel_0\n"  # the adversary's file: the right key and label, one feature of 64


def served_from_files(settings: dict[str, str], models: Path) -> dict[str, str]:
    """`settings` serving the model from its configuration file in `models` (RETRAIN_MODELS): its task,
    [gate], [pipeline] and [trigger] are the file's."""
    served = {**settings, "RETRAIN_MODELS": MODEL, "RETRAIN_MODELS_DIR": str(models)}
    for single in ("RETRAIN_MODEL_NAME", "RETRAIN_BLOB_PREFIX"):  # the file's [trigger] says them
        served.pop(single)
    return served


def _files(record) -> list[str]:
    return [file.name for file in DataManifest.from_json(record.details["manifest"]).files]


def _land(door: FrontDoor, landing: Path, home: Path) -> None:
    """Deliver the landing folder's new files, as `retrain watch --once` does."""
    scope = door.settings.models[0].scope
    Watcher(
        FolderSource(landing, scope), scope, home, lambda event: door.deliver(event, "blob"), utc_now
    ).poll()


def test_a_malformed_landing_file_is_left_out_named_once_and_later_uploads_train_and_register(
    tmp_path, caplog
):
    batches, landing, home = tmp_path / "batches", tmp_path / "landing", tmp_path / "home"
    write_sample_batches(batches, batches=2)
    landing.mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f"{MODEL}.toml").write_text(MODEL_FILE)
    settings = app_settings(
        home,
        RETRAIN_SUBMITTER="local",
        RETRAIN_LANDING_FOLDER=str(landing),
        RETRAIN_MODELS_DIR=str(tmp_path / "models"),
    )
    environ = {**os.environ, **settings}  # the steps' environment, as `retrain flush` gives them its own
    door = build_front_door(AppSettings.from_environ(environ), environ)
    ledger = open_ledger(settings["RETRAIN_LEDGER"])
    caplog.set_level(logging.WARNING, logger="function_app.flush")

    # The adversary's file lands beside a good batch, and sorts before it: it used to set the schema.
    (landing / "batch-0001.csv").write_bytes((batches / "batch-0001.csv").read_bytes())
    (landing / "bad.csv").write_bytes(MALFORMED)
    _land(door, landing, home)
    [first] = door.flush(ignore_quiet=True)

    assert first.status == COMPLETED, first.details
    assert _files(first) == ["bad.csv", "batch-0001.csv"]
    [reported] = first.details[REJECTED_KEY]
    assert reported["name"] == "bad.csv"
    assert reported["reason"].startswith("missing columns 'pixel_1', 'pixel_2'")
    assert reported["reason"].endswith("expected the columns row_key, label, pixel_0..pixel_63 (any order)")
    assert first.details["decision"] == "registered"
    [claim] = ledger.claims(MODEL, tag=DROPPED)
    assert claim.record.item.blob.url.endswith(f"/{PREFIX}/bad.csv")
    assert (claim.record.decision, claim.record.reason) == (
        "rejected",
        f"left out by prep: {reported['reason']}",
    )

    # A later upload trains on every good file, and registers; the bad one is carried into no version.
    (landing / "batch-0002.csv").write_bytes((batches / "batch-0002.csv").read_bytes())
    _land(door, landing, home)
    [later] = door.flush(ignore_quiet=True)

    assert later.status == COMPLETED, later.details
    assert _files(later) == ["batch-0001.csv", "batch-0002.csv"]
    assert later.details[REJECTED_KEY] == [] and later.details["decision"] == "registered"
    assert int(later.details["registered_version"]) == int(first.details["registered_version"]) + 1
    lines = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    [line] = [line for line in lines if "bad.csv" in line]  # reported once, by its own name
    assert line.startswith(f"flush {MODEL}: submission {first.id} left out raw file bad.csv (")
    assert "batch-0001.csv" not in line and "\n" not in line
    assert ledger.load_state(MODEL)[0].runs_today == 2


def test_a_large_file_of_another_schema_is_the_one_left_out_the_models_schema_is_its_last_good_versions(
    tmp_path, caplog
):
    batches, landing, home = tmp_path / "batches", tmp_path / "landing", tmp_path / "home"
    write_sample_batches(batches, batches=4)
    landing.mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f"{MODEL}.toml").write_text(MODEL_FILE.replace("epochs = 2", "epochs = 1"))
    local = app_settings(home, RETRAIN_SUBMITTER="local", RETRAIN_LANDING_FOLDER=str(landing))
    settings = served_from_files(local, tmp_path / "models")
    environ = {**os.environ, **settings}
    door = build_front_door(AppSettings.from_environ(environ), environ)
    ledger = open_ledger(settings["RETRAIN_LEDGER"])
    caplog.set_level(logging.WARNING, logger="function_app.flush")

    (landing / "batch-0001.csv").write_bytes((batches / "batch-0001.csv").read_bytes())
    _land(door, landing, home)
    [first] = door.flush(ignore_quiet=True)
    assert first.status == COMPLETED, first.details
    assert first.details["task"] == "tabular" and PREVIOUS not in first.details  # the model's first data
    good = Path(first.details[PREPARED_KEY])

    # Someone uploads the wrong table into the prefix: valid rows under another header, more bytes than all
    # the model's data. By size it would fix the schema, and every good file would be left out.
    rows = "".join(f"order-{n},{n % 10},{n % 7}.5,{n % 3}.25\n" for n in range(12_000))
    (landing / "big-table.csv").write_text("row_key,label,amount,discount\n" + rows)
    (landing / "batch-0002.csv").write_bytes((batches / "batch-0002.csv").read_bytes())
    assert (landing / "big-table.csv").stat().st_size > sum(
        (landing / name).stat().st_size for name in ("batch-0001.csv", "batch-0002.csv")
    )
    _land(door, landing, home)
    [second] = door.flush(ignore_quiet=True)

    assert second.status == COMPLETED, second.details
    # Its prep was given the last good version, whose schema it kept: the large file is the one left out.
    assert second.details[PREVIOUS] == {"uri": str(good), "task": "tabular", "failed_runs": 0}
    assert [item["name"] for item in second.details[REJECTED_KEY]] == ["big-table.csv"]
    prepared = json.loads(Path(second.details[PREPARED_KEY], "manifest.json").read_text())
    assert prepared["previous_version"] == json.loads((good / "manifest.json").read_text())["data_version"]
    assert [entry["name"] for entry in prepared["raw_files"]] == ["batch-0001.csv", "batch-0002.csv"]
    [dropped] = ledger.claims(MODEL, tag=DROPPED)
    assert dropped.record.item.blob.url.endswith(f"/{PREFIX}/big-table.csv")

    # The next upload builds on that version: every good file, the large one in no later version.
    (landing / "batch-0003.csv").write_bytes((batches / "batch-0003.csv").read_bytes())
    _land(door, landing, home)
    [third] = door.flush(ignore_quiet=True)

    assert third.status == COMPLETED, third.details
    assert _files(third) == ["batch-0001.csv", "batch-0002.csv", "batch-0003.csv"]
    assert third.details[REJECTED_KEY] == []
    assert third.details[PREVIOUS]["uri"] == second.details[PREPARED_KEY]
    lines = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert [line for line in lines if "left out raw file" in line] == [
        line for line in lines if "big-table.csv" in line
    ]  # named once, and no good file ever
    assert len([line for line in lines if "big-table.csv" in line]) == 1
    assert ledger.load_state(MODEL)[0].runs_today == 3


class ReportingJobs:
    """Azure ML's job service at the Submitter seam: a job is queued when submitted, and ends Completed at
    the next status, with what its prepare step left out (the Azure ML submitter reads that from the prep
    child's `rejected_inputs` output: tests/components/azureml/test_azureml_submitter.py)."""

    def __init__(self, left_out: dict[str, str]) -> None:
        self.left_out = left_out
        self.requests: list[RunRequest] = []

    def submit(self, request: RunRequest) -> Submission:
        self.requests.append(request)
        return Submission(request.job_name(), "jobs", QUEUED, request.run_key)

    def status(self, job_name: str) -> Submission:
        rejected = [{"name": name, "reason": reason} for name, reason in self.left_out.items()]
        return Submission(job_name, "jobs", COMPLETED, "", {REJECTED_KEY: rejected})


def test_a_remote_jobs_left_out_file_is_recorded_when_the_job_ends_and_never_pinned_again(tmp_path):
    landing, home = tmp_path / "landing", tmp_path / "home"
    landing.mkdir()
    settings = app_settings(home, RETRAIN_SUBMITTER="local", RETRAIN_LANDING_FOLDER=str(landing))
    jobs = ReportingJobs({"bad.csv": "missing column 'label'; expected the columns row_key, label, a"})
    door = build_front_door(AppSettings.from_environ(settings), settings, submitter=jobs)
    ledger = open_ledger(settings["RETRAIN_LEDGER"])
    (landing / "good.csv").write_text("row_key,label,a\nr1,0,1\n")
    (landing / "bad.csv").write_text("row_key,a\nr2,2\n")
    _land(door, landing, home)

    [queued] = door.flush(ignore_quiet=True)
    assert queued.status == QUEUED and ledger.claims(MODEL, tag=DROPPED) == []
    (landing / "later.csv").write_text("row_key,label,a\nr3,1,3\n")
    _land(door, landing, home)
    [later] = door.flush(ignore_quiet=True)  # first ends the queued job, reading its report

    ended = ledger.submission(queued.id)
    assert ended.status == COMPLETED and ended.details[REJECTED_KEY][0]["name"] == "bad.csv"
    [dropped] = ledger.claims(MODEL, tag=DROPPED)
    assert (
        dropped.record.reason
        == "left out by prep: missing column 'label'; expected the columns row_key, label, a"
    )
    assert _files(later) == ["good.csv", "later.csv"]


class PreparingJobs:
    """Azure ML's job service at the Submitter seam: a job is queued when submitted and ends, at the next
    status, as the test says (Completed unless told otherwise); a completed one says where its prepare step's
    output lies, as the Azure ML submitter reads it from run history."""

    def __init__(self) -> None:
        self.requests: list[RunRequest] = []
        self.ends: dict[str, str] = {}

    def submit(self, request: RunRequest) -> Submission:
        self.requests.append(request)
        return Submission(request.job_name(), "jobs", QUEUED, request.run_key)

    def status(self, job_name: str) -> Submission:
        status = self.ends.get(job_name, COMPLETED)
        details = {PREPARED_KEY: self.prepared(job_name)} if status == COMPLETED else {}
        return Submission(job_name, "jobs", status, "", details)

    @staticmethod
    def prepared(job_name: str) -> str:
        return f"azureml://datastores/workspaceblobstore/paths/azureml/{job_name}-prep/prepared_data/"


def test_the_last_good_prepared_version_rides_through_failed_runs_and_is_let_go_after_two(tmp_path, caplog):
    landing, home = tmp_path / "landing", tmp_path / "home"
    landing.mkdir()
    settings = app_settings(home, RETRAIN_SUBMITTER="local", RETRAIN_LANDING_FOLDER=str(landing))
    jobs = PreparingJobs()
    door = build_front_door(AppSettings.from_environ(settings), settings, submitter=jobs)
    caplog.set_level(logging.WARNING, logger="function_app.flush")

    def upload_and_flush(name: str) -> None:
        (landing / name).write_text(f"row_key,label,a\n{name},1,2\n")
        _land(door, landing, home)
        door.flush(ignore_quiet=True)  # ends the job before, then submits this upload

    upload_and_flush("b1.csv")
    upload_and_flush("b2.csv")  # b1's job completed: b2 builds on its prepared data
    first, second = (request.job_name() for request in jobs.requests)
    jobs.ends[second] = "Failed"
    upload_and_flush("b3.csv")  # given it still: b2's failure is one
    jobs.ends[jobs.requests[-1].job_name()] = "Failed"
    upload_and_flush("b4.csv")  # two runs in a row failed given it: let go
    upload_and_flush("b5.csv")  # b4's job completed: its own prepared data now

    given = [request.previous_prepared for request in jobs.requests]
    assert given == [
        None,
        jobs.prepared(first),
        jobs.prepared(first),
        None,
        jobs.prepared(jobs.requests[3].job_name()),
    ]
    [line] = [record.getMessage() for record in caplog.records if "runs in a row" in record.getMessage()]
    assert line == (
        f"flush {MODEL}: 2 runs in a row given the prepared data version {jobs.prepared(first)} failed; "
        "the next run is prepared without it, its schema from most of its raw data"
    )

    # The model now names another task: the version the built-in one prepared is not one it reads.
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / f"{MODEL}.toml").write_text(
        '[task]\nref = "training.tasks.tabular.task:TabularTask"\n\n'
        '[trigger]\nprefix = "digits"\nsuffixes = [".csv"]\n'
    )
    moved = served_from_files(settings, tmp_path / "models")
    door = build_front_door(AppSettings.from_environ(moved), moved, submitter=jobs)
    upload_and_flush("b6.csv")
    assert len(jobs.requests) == 6, door.verdicts()
    assert jobs.requests[-1].task == "training.tasks.tabular.task:TabularTask"
    assert jobs.requests[-1].previous_prepared is None


def test_a_landing_symlink_is_never_delivered_nor_followed(tmp_path, caplog):
    landing, home = tmp_path / "landing", tmp_path / "home"
    landing.mkdir()
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    settings = app_settings(home, RETRAIN_SUBMITTER="local", RETRAIN_LANDING_FOLDER=str(landing))
    door = board_front_door(settings, tmp_path / "board")
    (landing / "passwd.csv").symlink_to(secret)
    (landing / "good.csv").write_text("row_key,label,a\nr1,0,1\n")
    caplog.set_level(logging.WARNING)

    scope = door.settings.models[0].scope
    watcher = Watcher(
        FolderSource(landing, scope), scope, home, lambda event: door.deliver(event, "blob"), utc_now
    )
    delivered = watcher.poll()
    watcher.poll()  # said once, not at every poll

    assert [event["data"]["url"].rsplit("/", 1)[1] for event in delivered] == ["good.csv"]
    [line] = [record.getMessage() for record in caplog.records if "passwd.csv" in record.getMessage()]
    assert line == (
        f"landing folder {landing}: passwd.csv is a symbolic link; it is not delivered (links are never "
        "followed); expected a regular file"
    )

    # A link put in a delivered file's place before the flush pins it is dropped, never read.
    (landing / "good.csv").unlink()
    (landing / "good.csv").symlink_to(secret)
    caplog.clear()
    assert door.flush(ignore_quiet=True) == []
    assert "nothing left to submit" in door.verdicts()[MODEL].reason
    [dropped] = open_ledger(settings["RETRAIN_LEDGER"]).claims(MODEL, tag=DROPPED)
    assert dropped.record.reason == (
        f"dropped from the batch: landing file {landing / 'good.csv'}: a symbolic link, which is never "
        "followed; expected a regular file in the landing folder"
    )
    assert not (home / "data").exists()  # nothing was pinned, so nothing was read through the link


def test_the_landing_pinner_refuses_a_link_in_a_files_place_and_under_a_class_folder(tmp_path):
    landing, secret = tmp_path / "landing", tmp_path / "secret.png"
    (landing / "circle").mkdir(parents=True)
    secret.write_bytes(b"not yours")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "a.png").write_bytes(b"not yours")
    (landing / "square").symlink_to(tmp_path / "elsewhere")
    (landing / "circle" / "a.png").symlink_to(secret)
    (landing / "circle" / "b.png").write_bytes(b"yours")
    pinner = LandingFolderCopy(
        landing, tmp_path / "home", "https://a.blob.core.windows.net/c/shapes", depth=2
    )
    etag = f"etag:{etag_of_bytes(b'not yours')}"
    manifest = DataManifest(
        (DataFile("circle/a.png", 9, etag, "u1"), DataFile("square/a.png", 9, etag, "u2"))
    )

    gone = {item.file.name: item.why for item in pinner.vanished(manifest, "shapes")}
    expected = "which is never followed; expected a regular file in the landing folder"
    assert gone == {
        "circle/a.png": f"a symbolic link, {expected}",
        "square/a.png": f"under the symbolic link {landing / 'square'}, {expected}",
    }
    # A request to train on the landing folder as it is lists its regular files only.
    listed = pinner.folder_manifest("https://a.blob.core.windows.net/c/shapes", (".png",), "shapes")
    assert [file.name for file in listed.files] == ["circle/b.png"]
    try:
        pinner.pin(manifest, "shapes")
    except PinError as error:
        assert str(error).startswith(f"landing file {landing / 'circle' / 'a.png'}: a symbolic link")
    else:
        raise AssertionError("a link was pinned")


def test_files_one_level_too_deep_are_said_once_and_not_delivered(tmp_path, caplog):
    landing, home = tmp_path / "landing", tmp_path / "home"
    (landing / MODEL).mkdir(parents=True)  # the slip: the folder already stands for the model's prefix
    (landing / MODEL / "b1.csv").write_text("row_key,label,a\nr1,0,1\n")
    (landing / "empty").mkdir()  # an empty sub-folder holds nothing to warn about
    (landing / "good.csv").write_text("row_key,label,a\nr2,0,1\n")
    settings = app_settings(home, RETRAIN_SUBMITTER="local", RETRAIN_LANDING_FOLDER=str(landing))
    door = board_front_door(settings, tmp_path / "board")
    caplog.set_level(logging.WARNING)

    scope = door.settings.models[0].scope
    watcher = Watcher(
        FolderSource(landing, scope), scope, home, lambda event: door.deliver(event, "blob"), utc_now
    )
    delivered = watcher.poll()
    watcher.poll()  # said once, not at every poll

    assert [event["data"]["url"].rsplit("/", 1)[1] for event in delivered] == ["good.csv"]
    [line] = [record.getMessage() for record in caplog.records if "not delivered" in record.getMessage()]
    assert line == (
        f"landing folder {landing}: {MODEL}/ holds files below the folder's depth, which are not delivered; "
        f"expected them in the landing folder itself, which stands for {scope.container_url}/{scope.folder}"
    )
