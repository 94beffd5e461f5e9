"""`POST /api/retrain` does what it says: `data` is what the run pins, exactly; an Idempotency-Key reused
with another body is refused (422); the status URL is the request's own, without its query (where a
function key travels)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from helpers.function_app.corpus import EVENT_GRID, PREFIX, STORAGE_TOPIC, blob_created
from helpers.function_app.front_door_settings import app_settings

from function_app.events.triggers import SUBMITTED
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

FUNCTION_URL = "https://retrain-fn.azurewebsites.net/api/retrain"


def _door(environ):
    return build_front_door(AppSettings.from_environ(environ), environ)


@pytest.fixture
def landing(azurite, tmp_path):
    """A landing container on Azurite with two files in the model's folder, one in a sub-folder, one in
    another folder, and the settings of a dry-run front door over it."""
    name = f"landing-{uuid.uuid4().hex[:12]}"
    container = azurite.service_client().create_container(name)
    for blob, data in {
        f"{PREFIX}/a.csv": b"x,label\n1,0\n",
        f"{PREFIX}/b.csv": b"x,label\n2,1\n",
        f"{PREFIX}/old/c.csv": b"x,label\n3,0\n",
        "elsewhere/d.csv": b"x,label\n4,1\n",
    }.items():
        container.upload_blob(blob, data)
    account = azurite.blob_endpoint.rsplit("/", 1)[-1]
    environ = app_settings(
        tmp_path / "home",
        RETRAIN_BLOB_ACCOUNT=account,
        RETRAIN_BLOB_CONTAINER=name,
        RETRAIN_BLOB_ENDPOINT=azurite.blob_endpoint,
        RETRAIN_STORAGE_CONNECTION_STRING=azurite.connection_string,
    )
    return container, environ, f"{azurite.blob_endpoint}/{name}"


def test_post_with_a_folder_pins_exactly_that_folders_files(landing):
    container, environ, container_url = landing
    door = _door(environ)
    # A blob that landed through an event waits in the pending batch meanwhile; it is not that data.
    account = container_url.rsplit("/", 2)[-2]
    topic = STORAGE_TOPIC.rsplit("/", 1)[0] + f"/{account}"
    name = container_url.rsplit("/", 1)[-1]
    url = f"{container_url}/{PREFIX}/z.csv"
    event = blob_created(EVENT_GRID, f"{PREFIX}/z.csv", container=name, url=url, envelope={"topic": topic})
    outcome = door.deliver(event, "blob")
    assert outcome.decision == "debounced", outcome.reason
    body = json.dumps({"data": f"{container_url}/{PREFIX}", "force": True}).encode()

    answer = door.retrain(body, {}, FUNCTION_URL)

    assert (answer.status, answer.body["decision"]) == (202, SUBMITTED)
    [submission] = door.ledger.snapshot()["submissions"]
    etags = {
        b: container.get_blob_client(f"{PREFIX}/{b}.csv").get_blob_properties().etag.strip('"') for b in "ab"
    }
    assert submission["pins"] == [
        {"url": f"{container_url}/{PREFIX}/{b}.csv", "fingerprint": f"etag:{etags[b]}"} for b in "ab"
    ]
    manifest = json.loads(submission["details"]["manifest"])
    assert sorted(file["name"] for file in manifest["files"]) == ["a.csv", "b.csv"]
    assert (
        submission["status"] == "Completed"
        and submission["job_name"] == f"retrain-digits-{submission['raw_version']}"
    )
    # The event's blob is still pending, for the next batch.
    [pending] = door.ledger.claims("digits")
    assert pending.record.item.blob.url == url


def test_post_with_a_registered_asset_pins_that_asset(landing):
    _, environ, _ = landing
    door = _door(environ)
    asset = "azureml:digits-raw:rd-0123456789abcdef"

    answer = door.retrain(json.dumps({"data": asset, "force": True}).encode(), {}, FUNCTION_URL)

    assert answer.status == 202
    [submission] = door.ledger.snapshot()["submissions"]
    assert (submission["raw_version"], submission["job_name"]) == (
        "rd-0123456789abcdef",
        "retrain-digits-rd-0123456789abcdef",
    )
    request = json.loads(
        (environ_home(environ) / "dry-runs" / submission["job_name"] / "request.json").read_text()
    )
    assert request["data"]["uri"] == asset


def environ_home(environ):

    return Path(environ["RETRAIN_HOME"])


def test_an_empty_or_foreign_folder_changes_nothing(landing):
    _, environ, container_url = landing
    door = _door(environ)

    empty = door.retrain(
        json.dumps({"data": f"{container_url}/{PREFIX}/none", "force": True}).encode(), {}, FUNCTION_URL
    )
    foreign = door.retrain(json.dumps({"data": f"{container_url}/elsewhere"}).encode(), {}, FUNCTION_URL)

    assert foreign.status == 400 and "elsewhere" in foreign.body["error"]
    assert empty.status == 422 and "no .csv or .parquet files" in empty.body["error"]
    # Recorded as a submission that started no run: nothing pending, nothing spent, nothing blocked.
    [submission] = door.ledger.snapshot()["submissions"]
    assert (submission["status"], submission["job_name"]) == ("Failed", None)
    assert door.ledger.claims("digits") == []
    state, _ = door.ledger.load_state("digits")
    assert (state.in_flight_id, state.runs_today) == (None, 0)


def test_an_asset_is_refused_where_runs_are_local(tmp_path):
    door = _door(
        app_settings(tmp_path / "home", RETRAIN_SUBMITTER="local", RETRAIN_LANDING_FOLDER=str(tmp_path))
    )
    answer = door.retrain(b'{"data": "azureml:digits-raw:rd-0123456789abcdef"}', {}, FUNCTION_URL)
    assert answer.status == 400 and "runs on this machine cannot read" in answer.body["error"]


def test_a_reused_key_with_another_body_is_422_and_the_same_body_gets_the_first_answer(tmp_path):
    door = _door(
        app_settings(
            tmp_path / "home", RETRAIN_DEBOUNCE_QUIET_SECONDS="60", RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS="60"
        )
    )
    key = {"Idempotency-Key": "nightly-2026-12-01"}

    first = door.retrain(b'{"reason": "nightly"}', key, FUNCTION_URL)
    again = door.retrain(b'{ "reason" : "nightly" }', key, FUNCTION_URL)
    other = door.retrain(b'{"reason": "something else"}', key, FUNCTION_URL)

    assert first.status == again.status == 202 and again.body == first.body
    assert other.status == 422 and "another request body" in other.body["error"]
    [claim] = door.ledger.claims("digits")
    assert claim.record.item.reason == "nightly"  # the first body, unchanged


def test_the_status_url_is_the_requests_own_without_its_key(tmp_path):
    door = _door(app_settings(tmp_path / "home"))
    secret = "k3y-Zm9vYmFyYmF6cXV4"

    answer = door.retrain(
        b"{}", {}, f"https://user:pw@retrain-fn.azurewebsites.net/api/retrain?code={secret}"
    )

    assert answer.body["status_url"] == f"{FUNCTION_URL}/{answer.body['id']}"
    assert secret not in json.dumps(answer.body) and "pw@" not in json.dumps(answer.body)


def test_a_run_on_a_requests_own_data_does_not_drop_the_landed_data_from_the_next_batch(landing):
    _, environ, container_url = landing
    door = _door(environ)
    name = container_url.rsplit("/", 1)[-1]
    account = container_url.rsplit("/", 2)[-2]
    topic = STORAGE_TOPIC.rsplit("/", 1)[0] + f"/{account}"

    def land(blob: str) -> None:
        url = f"{container_url}/{PREFIX}/{blob}"
        event = blob_created(
            EVENT_GRID, f"{PREFIX}/{blob}", container=name, url=url, envelope={"topic": topic}
        )
        assert door.deliver(event, "blob").decision == "debounced"

    land("z.csv")
    [first] = door.flush(ignore_quiet=True)
    door.retrain(b'{"data": "azureml:digits-raw:rd-0123456789abcdef", "force": true}', {}, FUNCTION_URL)
    land("y.csv")
    [third] = door.flush(ignore_quiet=True)

    files = json.loads(third.details["manifest"])["files"]
    assert sorted(file["name"] for file in files) == ["y.csv", "z.csv"]  # z.csv from the first batch's basis
    assert first.status == third.status == "Completed"
