"""`retrain event | watch | trigger | flush | ledger`: the front door run locally, standing in for Event Grid
and the Functions host. Each command runs as the root CLI runs it: parsed arguments, the environment as
`args.environ`, the state folder as `args.state_root`; blobs on the real Azurite emulator."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import secrets
from pathlib import Path

import pytest
from helpers.function_app.corpus import (
    ACCOUNT,
    CLOUD_EVENTS,
    CONTAINER,
    FAKE_ACCOUNT_KEY,
    PREFIX,
    blob_created,
    blob_url,
    dataset_drift_detected,
    retrain_drift_detected,
)

from function_app.events.triggers import DECISIONS
from function_app.local.cli import register_commands
from function_app.local.watch import WATCH_DIR

ENDPOINT = f"https://{ACCOUNT}.blob.core.windows.net"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retrain")
    register_commands(parser.add_subparsers(dest="command", required=True))
    return parser


@pytest.fixture
def settings(tmp_path, app_settings) -> dict[str, str]:
    return app_settings(tmp_path / "home")


@pytest.fixture
def retrain(capsys, settings):
    """`retrain(*argv, **setting_overrides)` -> (exit code, stdout lines, stderr lines)."""

    def run(*argv: str, **overrides: str) -> tuple[int, list[str], list[str]]:
        args = _parser().parse_args(list(argv))
        args.environ = {**settings, **overrides}
        args.state_root = Path(args.environ["RETRAIN_HOME"])
        code = args.handler(args)
        out, err = capsys.readouterr()
        return code, out.splitlines(), err.splitlines()

    return run


def _write(path: Path, document) -> Path:
    path.write_text(json.dumps(document))
    return path


def _ledger(retrain, **overrides) -> dict:
    code, out, _ = retrain("ledger", "--json", **overrides)
    assert code == 0
    return json.loads("\n".join(out))


# -- event --------------------------------------------------------------------------------------------------


def test_event_delivers_every_payload_and_prints_each_decision_once(retrain, tmp_path, caplog):
    drift, own_drift = dataset_drift_detected(), retrain_drift_detected(CLOUD_EVENTS)
    array = _write(
        tmp_path / "events.json",
        [
            blob_created(),
            drift,
            blob_created(name=f"{PREFIX}/empty.csv", contentLength=0, envelope={"id": "empty"}),
            blob_created(envelope={"id": "again"}),
        ],
    )
    single = _write(tmp_path / "drift.json", own_drift)

    quiet = {"RETRAIN_DEBOUNCE_QUIET_SECONDS": "60", "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": "60"}
    with caplog.at_level(logging.DEBUG):
        code, out, err = retrain("event", str(array), str(single), **quiet)

    claim = next(e["id"] for e in _ledger(retrain)["events"] if e["decision"] == "debounced")
    # One line per delivery, naming the file it came from and the blob (a drift alert has none: its id).
    assert (code, err) == (0, [])
    assert out == [
        f"{array}[0]: blob {PREFIX}/batch-0001.csv: debounced "
        "(joined the pending batch; it is submitted after the quiet period)",
        f"{array}[1]: drift event {drift['id']}: accepted (accepted for the next run)",
        f"{array}[2]: blob {PREFIX}/empty.csv: rejected "
        "(contentLength 0: an empty blob holds no data; expected more than 0 bytes)",
        f"{array}[3]: blob {PREFIX}/batch-0001.csv: duplicate "
        f"(duplicate of an event already claimed as {claim})",
        f"{single}: drift event {own_drift['id']}: accepted (accepted for the next run)",
    ]
    # Not logged a second time: neither the handler's line nor the front door's own (above INFO).
    assert [r.getMessage() for r in caplog.records if r.name.startswith("function_app.blueprints")] == []
    assert [
        r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "empty" in r.getMessage()
    ] == []
    snapshot = _ledger(retrain)
    decisions = [event["decision"] for event in snapshot["events"]]
    # The duplicate lost its claim and is recorded beside it: one record per event.
    assert sorted(decisions) == ["accepted", "accepted", "debounced", "rejected"]
    assert [(d["event_id"], d["duplicate_of"]) for d in snapshot["duplicates"]] == [("again", claim)]


def test_ledger_tells_what_became_of_any_event_id(retrain, tmp_path):
    first = blob_created()
    events = [
        first,
        blob_created(envelope={"id": "second-write"}),
        first,
        blob_created(envelope={"id": "x?"}),
    ]
    retrain("event", str(_write(tmp_path / "events.json", events)))
    [claim] = _ledger(retrain)["events"]

    code, out, _ = retrain("ledger")  # a section of duplicates, each naming its claim
    duplicates = out[out.index("duplicates (2):") + 1 : out.index("submissions (0):")]
    assert code == 0 and len(duplicates) == 2
    assert all(f"duplicate of {claim['id']}" in line for line in duplicates)
    assert any(line.endswith("event second-write") for line in duplicates)

    code, out, _ = retrain("ledger", "--event", first["id"])  # a claim: its decision
    assert (code, len(out)) == (0, 1) and out[0].startswith(f"{claim['id']}  blob   {claim['decision']}")
    for asked in ("second-write", "x?"):  # a duplicate, by its event id: the claim it duplicates
        code, out, _ = retrain("ledger", "--event", asked)
        assert code == 0 and f"duplicate of {claim['id']}" in out[0] and out[0].endswith(f"event {asked}")
        assert out[1].startswith(f"  {claim['id']}  blob   {claim['decision']}")
    code, out, _ = retrain("ledger", "--event", "second-write", "--json")
    answer = json.loads("\n".join(out))
    assert answer["events"] == [] and [d["event_id"] for d in answer["duplicates"]] == ["second-write"]
    assert (
        answer["duplicates"][0]["duplicate_of"] == claim["id"] and answer["duplicates"][0]["claim"] == claim
    )
    code, out, _ = retrain("ledger", "--event", answer["duplicates"][0]["id"])  # or by its record id
    assert code == 0 and "event second-write" in out[0]

    code, out, err = retrain("ledger", "--event", "never-delivered")
    assert (code, out) == (2, []) and len(err) == 1
    assert err[0].startswith("retrain ledger: error: no event 'never-delivered' in the ledger; expected")


def test_event_goes_to_the_trigger_it_is_told(retrain, tmp_path):
    path = _write(tmp_path / "blob.json", blob_created())

    code, out, _ = retrain("event", "--trigger", "drift", str(path))

    assert code == 0
    assert "rejected (" in out[0] and "is not a drift alert" in out[0]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it (No such file or directory)"),
        (b"\xff\xfe not text", "cannot read it"),
        (b'{"id": "1", "eventType": ', "not JSON"),
        (b"42", "is a JSON number; expected an event object"),
        (b'[{"id": "1"}, "two"]', "element 1 of the array is a JSON string"),
    ],
    ids=["missing", "not-utf8", "not-json", "a-number", "not-an-event"],
)
def test_event_refuses_bad_files_before_delivering_anything(retrain, tmp_path, content, message):
    good = _write(tmp_path / "good.json", blob_created())
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_bytes(content)

    code, out, err = retrain("event", str(good), str(bad))

    assert (code, out, len(err)) == (2, [], 1)
    assert err[0].startswith(f"retrain event: error: {bad}") and message in err[0]
    assert _ledger(retrain)["events"] == []  # nothing half-done: the good file was not delivered either


def test_event_reports_a_failed_delivery_in_one_line(retrain, tmp_path, azurite):
    path = _write(tmp_path / "events.json", [blob_created(), retrain_drift_detected()])
    missing = f"{azurite.blob_endpoint}/no-such-ledger-container"

    code, out, err = retrain(
        "event",
        str(path),
        RETRAIN_LEDGER=missing,
        RETRAIN_STORAGE_CONNECTION_STRING=azurite.connection_string,
    )

    assert (code, out, len(err)) == (1, [], 1)
    assert err[0].startswith(f"retrain event: error: {path}[0]: delivery to the blob trigger failed")
    assert "does not exist" in err[0] and "0 of 2 delivered" in err[0]
    assert azurite.account_key not in err[0]


def test_a_bad_setting_is_one_line_naming_it(retrain):
    code, out, err = retrain("flush", RETRAIN_MAX_RUNS_PER_DAY="many")
    assert (code, out, len(err)) == (2, [], 1)
    assert "RETRAIN_MAX_RUNS_PER_DAY 'many': expected a whole number" in err[0]

    code, _, err = retrain(
        "ledger",
        RETRAIN_LEDGER="http://127.0.0.1:10000/devstoreaccount1/ledger",
        RETRAIN_STORAGE_CONNECTION_STRING=f"AccountName=other;AccountKey={FAKE_ACCOUNT_KEY};BlobEndpoint=x",
    )
    assert code == 2 and len(err) == 1
    assert FAKE_ACCOUNT_KEY not in err[0]


# -- trigger, flush, ledger ---------------------------------------------------------------------------------


def test_trigger_does_what_the_post_does(retrain):
    code, out, _ = retrain("trigger", "--reason", "new labels", "--idempotency-key", "labels-1")
    assert code == 0
    status, body = out[0].split(" ", 1)
    answer = json.loads(body)
    assert (status, answer["decision"]) == ("202", "accepted")
    assert answer["status_url"] == f"http://localhost:7071/api/retrain/{answer['id']}"

    code, out, _ = retrain("trigger", "--reason", "new labels", "--idempotency-key", "labels-1")
    assert code == 0 and json.loads(out[0].split(" ", 1)[1]) == answer  # the first answer again

    code, out, _ = retrain("trigger", "--reason", "other labels", "--idempotency-key", "labels-1")
    assert code == 2 and out[0].startswith("422 ") and "another request body" in out[0]

    code, out, _ = retrain("trigger", "--data", "file:///etc/passwd")
    assert code == 2 and out[0].startswith("400 ") and "expected a blob folder URL" in out[0]


def test_trigger_held_back_says_when_to_retry(retrain, tmp_path):
    waits = {"RETRAIN_COOLDOWN_SECONDS": "3600"}
    retrain("event", str(_write(tmp_path / "blob.json", blob_created())), **waits)
    code, out, _ = retrain("trigger", "--force", **waits)
    [submission] = _ledger(retrain, **waits)["submissions"]
    # Submitted at once: the answer, then what its status URL tells (a dry run: no gate to report).
    assert code == 0 and json.loads(out[0].split(" ", 1)[1])["decision"] == "submitted"
    assert out[1:] == [f"submission {submission['id']}: Completed, job {submission['job_name']}"]
    assert retrain("flush", **waits)[0] == 0  # the dry run has ended: the cooldown alone holds back now

    code, out, _ = retrain("trigger", "--reason", "more", **waits)

    assert code == 75
    assert out[0].startswith("409 ") and '"decision": "cooldown"' in out[0]
    assert out[0].endswith(" s)") and "(Retry-After: " in out[0]


def test_flush_waits_for_the_quiet_period_unless_now(retrain, tmp_path):
    quiet = {"RETRAIN_DEBOUNCE_QUIET_SECONDS": "3600", "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": "3600"}
    retrain("event", str(_write(tmp_path / "blob.json", blob_created())), **quiet)

    code, out, _ = retrain("flush", **quiet)
    assert (code, len(out)) == (0, 1)
    assert out[0].startswith("nothing submitted: debouncing uploads for ")
    assert _ledger(retrain)["submissions"] == []

    code, out, _ = retrain("flush", "--now", **quiet)
    [submission] = _ledger(retrain)["submissions"]
    assert submission["inputs"] == [blob_url(f"{PREFIX}/batch-0001.csv")]
    # A dry run ends with its job recorded: no gate ran, so nothing stands beside its status.
    assert (code, out) == (
        0,
        [
            f"submitted {submission['id']} (blob): data {submission['raw_version']}, 1 new input(s), "
            f"job {submission['job_name']}, status Completed"
        ],
    )


def test_ledger_prints_every_decision_and_submission(retrain, tmp_path):
    events = [blob_created(), blob_created(), retrain_drift_detected(), blob_created(container="other")]
    retrain("event", str(_write(tmp_path / "events.json", events)))
    retrain("flush")

    snapshot = _ledger(retrain)

    # The second delivery of the blob lost its claim to the first and wrote nothing.
    assert [e["decision"] for e in snapshot["events"]] == ["submitted", "submitted", "rejected"]
    for event in snapshot["events"]:
        assert {"id", "kind", "decision", "reason", "submission"} <= set(event)
        assert event["kind"] in ("blob", "drift", "http") and event["decision"] in DECISIONS
    [submission] = snapshot["submissions"]
    assert {"id", "kind", "raw_version", "inputs", "status"} <= set(submission)
    assert (submission["kind"], submission["status"]) == ("drift", "Completed")
    assert submission["inputs"] == [blob_url(f"{PREFIX}/batch-0001.csv")]
    assert snapshot["events"][0]["submission"] == submission["id"]

    code, out, _ = retrain("ledger")
    assert code == 0
    assert out[0] == "events (3):" and out[4] == "submissions (1):"
    assert submission["id"] in out[5] and "Completed" in out[5] and "1 input(s)" in out[5]
    # Under each submission, what it was estimated to spend (no price set: in GPU-hours).
    assert out[6] == f"    {submission['estimate']['summary']}"
    assert out[6].startswith("    estimated cost unpriced: 1 GPU(s) x ")


# -- watch --------------------------------------------------------------------------------------------------


def _decisions(lines: list[str]) -> list[str]:
    return [line.split(": ", 1)[1].split(" (", 1)[0] for line in lines if line.startswith("blob ")]


def test_watch_delivers_each_new_file_version_once(retrain, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.csv").write_text("x,y\n1,2\n")
    (landing / "b.csv").write_text("x,y\n3,4\n")
    (landing / ".a.csv.swp").write_text("editor state")  # hidden: not landing data
    (landing / "nested").mkdir()
    (landing / "nested" / "c.csv").write_text("x,y\n5,6\n")  # a sub-folder: not a blob of the prefix
    quiet = {"RETRAIN_DEBOUNCE_QUIET_SECONDS": "3600", "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": "3600"}

    code, out, _ = retrain("watch", "--once", "--folder", str(landing), **quiet)
    assert code == 0
    # One line per delivery, naming the blob: its decision and why.
    joined = "debounced (joined the pending batch; it is submitted after the quiet period)"
    assert out == [
        f"watching folder {landing} as {ENDPOINT}/{CONTAINER}/{PREFIX}/ (the files directly in it)",
        f"blob {PREFIX}/a.csv: {joined}",
        f"blob {PREFIX}/b.csv: {joined}",
    ]
    assert retrain("watch", "--once", "--folder", str(landing), **quiet)[1][1:] == []  # nothing new

    (landing / "a.csv").write_text("x,y\n1,2\n7,8\n")
    (landing / "empty.csv").write_text("")
    code, out, _ = retrain("watch", "--once", "--folder", str(landing), **quiet)
    assert code == 0 and sorted(_decisions(out)) == ["debounced", "rejected"]

    events = _ledger(retrain)["events"]
    keys = [e["dedupe_key"] for e in events if e["decision"] == "debounced"]
    assert sorted(key.split("#")[0] for key in keys) == [
        f"blob:{ENDPOINT}/{CONTAINER}/{PREFIX}/a.csv",
        f"blob:{ENDPOINT}/{CONTAINER}/{PREFIX}/a.csv",
        f"blob:{ENDPOINT}/{CONTAINER}/{PREFIX}/b.csv",
    ]
    os.utime(landing / "b.csv")  # touched, same content: the same version
    assert _decisions(retrain("watch", "--once", "--folder", str(landing), **quiet)[1]) == []

    assert retrain("flush", "--now", **quiet)[0] == 0
    [submission] = _ledger(retrain)["submissions"]
    pins = {pin["url"]: pin["fingerprint"] for pin in submission["pins"]}
    content_hash = hashlib.sha256(b"x,y\n1,2\n7,8\n").hexdigest()[:32].upper()
    assert pins[blob_url(f"{PREFIX}/a.csv")] == f"etag:0x{content_hash}"  # the newest version

    # A lost watch state delivers everything again: the ledger knows every version already (a rejection is
    # recorded again: it is never claimed).
    for path in (tmp_path / "home" / WATCH_DIR).iterdir():
        path.unlink()
    code, out, _ = retrain("watch", "--once", "--folder", str(landing), **quiet)
    assert code == 0 and sorted(_decisions(out)) == ["duplicate", "duplicate", "rejected"]


def test_watch_remembers_only_what_was_delivered(retrain, tmp_path, azurite):
    landing = tmp_path / "landing"
    landing.mkdir()
    for name in ("a.csv", "b.csv"):
        (landing / name).write_text(f"x,y\n{name},1\n")
    service = azurite.service_client()
    ledger_container = f"ledger-{secrets.token_hex(6)}"
    on_azurite = {
        "RETRAIN_LEDGER": f"{azurite.blob_endpoint}/{ledger_container}",
        "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string,
    }

    code, out, err = retrain("watch", "--once", "--folder", str(landing), **on_azurite)  # no ledger yet

    assert (code, out[1:], len(err)) == (1, [], 1)
    assert err[0].startswith("retrain watch: error: poll failed: the ledger's container")
    service.create_container(ledger_container)
    code, out, _ = retrain("watch", "--once", "--folder", str(landing), **on_azurite)
    assert code == 0 and _decisions(out) == ["debounced", "debounced"]  # the next poll delivers both
    service.delete_container(ledger_container)


def test_watch_delivers_the_azurite_containers_new_blobs(retrain, azurite):
    container = azurite.new_container()
    name = container.container_name
    on_azurite = {
        "RETRAIN_BLOB_ACCOUNT": azurite.account,
        "RETRAIN_BLOB_ENDPOINT": azurite.blob_endpoint,
        "RETRAIN_BLOB_CONTAINER": name,
        "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string,
    }
    for blob in ("a.csv", "b.parquet"):
        container.upload_blob(f"{PREFIX}/{blob}", b"x,y\n1,2\n")
    container.upload_blob("elsewhere/c.csv", b"x,y\n1,2\n")  # outside the prefix: never listed

    code, out, err = retrain("watch", "--once", "--container", "--flush", **on_azurite)

    assert code == 0, err
    folder = f"{azurite.blob_endpoint}/{name}/{PREFIX}/"
    assert out[0] == f"watching container {folder}"
    assert _decisions(out) == ["debounced", "debounced"]
    assert out[-1].startswith("submitted s-") and "2 new input(s)" in out[-1]
    [submission] = _ledger(retrain, **on_azurite)["submissions"]
    assert sorted(submission["inputs"]) == [
        f"{azurite.blob_endpoint}/{name}/{PREFIX}/a.csv",
        f"{azurite.blob_endpoint}/{name}/{PREFIX}/b.parquet",
    ]
    etag = container.get_blob_client(f"{PREFIX}/a.csv").get_blob_properties().etag.strip('"')
    assert {
        "url": f"{azurite.blob_endpoint}/{name}/{PREFIX}/a.csv",
        "fingerprint": f"etag:{etag}",
    } in submission["pins"]

    assert _decisions(retrain("watch", "--once", "--container", **on_azurite)[1]) == []
    container.upload_blob(f"{PREFIX}/a.csv", b"x,y\n1,2\n3,4\n", overwrite=True)
    # The new version joins the next batch (the dry run finished when it was recorded).
    assert _decisions(retrain("watch", "--once", "--container", **on_azurite)[1]) == ["debounced"]
    container.delete_container()


def test_watch_needs_its_settings_and_folder(retrain, settings, tmp_path):
    no_blobs = {key: "" for key in settings if key.startswith("RETRAIN_BLOB_")}
    code, out, err = retrain("watch", "--once", **no_blobs)
    assert (code, out, len(err)) == (2, [], 1)
    assert "set RETRAIN_BLOB_ACCOUNT and RETRAIN_BLOB_CONTAINER" in err[0]
    assert not os.path.exists(settings["RETRAIN_HOME"] + f"/{WATCH_DIR}")

    code, out, err = retrain("watch", "--once", "--folder", str(tmp_path / "no-such-folder"))
    assert (code, out[1:], len(err)) == (2, [], 1)
    assert f"landing folder {tmp_path / 'no-such-folder'}: not a folder" in err[0]


def test_a_local_run_watches_only_the_folder_it_pins_from_and_says_where_its_run_failed(retrain, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    local = {"RETRAIN_SUBMITTER": "local"}

    code, out, err = retrain("watch", "--once", "--folder", str(landing), **local)

    assert (code, out, len(err)) == (2, [], 1)
    assert f"expected RETRAIN_LANDING_FOLDER={landing} too" in err[0]
    other = {**local, "RETRAIN_LANDING_FOLDER": str(tmp_path / "elsewhere")}
    assert retrain("watch", "--once", "--folder", str(landing), **other)[0] == 2

    # Set, it is the folder watched by default.
    local["RETRAIN_LANDING_FOLDER"] = str(landing)
    (landing / "unlabelled.csv").write_text("a,b\n1,2\n")
    code, out, _ = retrain("watch", "--once", **local)
    assert code == 0 and out[0].startswith(f"watching folder {landing} as ")
    joined = "debounced (joined the pending batch; it is submitted after the quiet period)"
    assert out[1:] == [f"blob {PREFIX}/unlabelled.csv: {joined}"]

    # A forced request runs the batch here and now, and says where and why the run failed.
    code, out, _ = retrain("trigger", "--force", **local)
    [submission] = _ledger(retrain, **local)["submissions"]
    assert code == 0 and len(out) == 2
    assert out[1].startswith(f"submission {submission['id']}: Failed at prep: ")
    assert out[1].endswith(
        f"unlabelled.csv: missing columns 'row_key', 'label'; expected the columns row_key, "
        f"label, a, b (any order), job {submission['job_name']}"
    )
