"""The real handler functions, invoked as the worker invokes them: each Event Grid event built by the worker's
own converter from a documented payload (an `EventGridEvent` for the Event Grid schema, a `CloudEvent` for
CloudEvents 1.0), each HTTP call an `HttpRequest`, the timer a `TimerRequest`. Behind them, a front door
started from app settings, with a local ledger and dry-run submissions."""

from __future__ import annotations

import json
import logging
import shutil

import azure.functions as func
import pytest
from azure.functions.timer import TimerRequest
from helpers.function_app.corpus import (
    BREACH_MESSAGE,
    CLOUD_EVENTS,
    ETAG,
    EVENT_GRID,
    FAKE_ACCOUNT_KEY,
    MAX_BODY_BYTES,
    MODEL,
    PREFIX,
    SEQUENCER,
    blob_created,
    blob_url,
    dataset_drift_detected,
    retrain_drift_detected,
    run_status_changed,
)

from function_app.local.worker import worker_event

BLOB, DRIFT = "on_blob_created", "on_drift_alert"
POST, GET, TIMER = "post_retrain", "get_retrain", "flush_batches"
FUNCTION_URL = "https://retrain-fn.azurewebsites.net/api/retrain"
NAME = f"{PREFIX}/batch-0001.csv"
WAITING = {"RETRAIN_DEBOUNCE_QUIET_SECONDS": "3600", "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": "3600"}


def _events(front) -> list[dict]:
    return front.ledger_snapshot()["events"]


def _pending(front) -> list:
    return [claim.record.item for claim in front.ledger.claims(MODEL)]


def _post(handler, body: bytes, **headers: str) -> func.HttpResponse:
    request = func.HttpRequest(
        "POST", FUNCTION_URL, headers={"Content-Type": "application/json", **headers}, body=body
    )
    return handler(POST)(request)


def _get(handler, identifier: str) -> func.HttpResponse:
    request = func.HttpRequest(
        "GET", f"{FUNCTION_URL}/{identifier}", route_params={"id": identifier}, body=b""
    )
    return handler(GET)(request)


def _json(response: func.HttpResponse) -> dict:
    assert response.mimetype == "application/json"
    return json.loads(response.get_body())


# -- Event Grid ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schema", [EVENT_GRID, CLOUD_EVENTS])
def test_a_blob_upload_joins_the_pending_batch(handler, start_front_door, schema):
    front = start_front_door(**WAITING)
    payload = blob_created(schema)
    event = worker_event(payload)
    assert json.loads(event) == payload  # the handler's `str` takes the event's JSON text, either schema

    assert handler(BLOB)(event) is None

    [record] = _events(front)
    assert (record["kind"], record["decision"], record["event_id"]) == ("blob", "debounced", payload["id"])
    [item] = _pending(front)
    assert (item.blob.url, item.blob.etag, item.blob.sequencer) == (blob_url(NAME), ETAG, SEQUENCER)
    assert item.blob.size == 524288
    assert front.flush() == []  # the quiet period has not passed


def test_the_same_upload_in_the_other_schema_is_a_duplicate(handler, start_front_door):
    front = start_front_door(**WAITING)
    payload = blob_created(EVENT_GRID)
    handler(BLOB)(worker_event(payload))
    # Another delivery of the same blob version, under another id (Event Grid may): keyed on url + eTag.
    handler(BLOB)(worker_event(blob_created(CLOUD_EVENTS, envelope={"id": "another-delivery"})))

    # The second delivery's claim lost to the first: it is recorded beside it, naming the claim.
    assert [(e["event_id"], e["decision"]) for e in _events(front)] == [(payload["id"], "debounced")]
    [claim] = _events(front)
    duplicates = front.ledger_snapshot()["duplicates"]
    assert [(d["event_id"], d["duplicate_of"]) for d in duplicates] == [("another-delivery", claim["id"])]
    assert len(_pending(front)) == 1


@pytest.mark.parametrize("schema", [EVENT_GRID, CLOUD_EVENTS])
@pytest.mark.parametrize(
    ("build", "said"),
    [
        (run_status_changed, BREACH_MESSAGE),
        (dataset_drift_detected, "coefficient 0.835"),
        (retrain_drift_detected, "psi 0.31 against threshold 0.2"),
    ],
    ids=["model-monitor", "dataset-drift-v1", "retrain-drift-check"],
)
def test_a_drift_alert_is_accepted_for_the_next_run(handler, start_front_door, schema, build, said):
    front = start_front_door(**WAITING)

    handler(DRIFT)(worker_event(build(schema)))

    [record] = _events(front)
    assert (record["kind"], record["decision"]) == ("drift", "accepted")
    [item] = _pending(front)
    assert item.kind == "drift" and said in item.reason


@pytest.mark.parametrize(
    ("function", "payload", "reason"),
    [
        (BLOB, blob_created(container="other"), "is not the configured container 'landing'"),
        (BLOB, blob_created(CLOUD_EVENTS, contentLength=0), "expected more than 0 bytes"),
        (BLOB, blob_created(name=f"{PREFIX}/../secrets/x.csv"), "'..' segment"),
        (BLOB, blob_created(url=blob_url(NAME) + f"?sig={FAKE_ACCOUNT_KEY}"), "carries a query"),
        (BLOB, run_status_changed(), "is not a blob upload"),
        (DRIFT, blob_created(), "is not a drift alert"),
        (DRIFT, run_status_changed(tags={}), "carry no azureml_modelmonitor_threshold_breached"),
        (DRIFT, retrain_drift_detected(CLOUD_EVENTS, model_name="fraud"), "is not this front door's"),
    ],
    ids=[
        "foreign-container",
        "empty-blob",
        "traversal",
        "sas-token",
        "drift-at-blob-trigger",
        "blob-at-drift-trigger",
        "status-change-not-drift",
        "other-model",
    ],
)
def test_a_rejection_is_acknowledged_and_recorded(handler, start_front_door, function, payload, reason):
    front = start_front_door()

    assert handler(function)(worker_event(payload)) is None  # returns: Event Grid must not retry it

    [record] = _events(front)
    assert record["decision"] == "rejected"
    assert reason in record["reason"]
    assert FAKE_ACCOUNT_KEY not in json.dumps(front.ledger_snapshot())
    assert _pending(front) == []


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (blob_created(CLOUD_EVENTS), f"blob {NAME}"),
        (blob_created(container="other"), f"blob {NAME}"),  # rejected, yet its subject names a blob
        (blob_created(name=f"{PREFIX}/../x.csv", envelope={"id": "tricky"}), "blob event tricky"),
        (run_status_changed(envelope={"id": "not-a-blob"}), "blob event not-a-blob"),
    ],
    ids=["accepted", "foreign-container", "traversal", "no-blob-subject"],
)
def test_the_blob_trigger_logs_one_line_naming_the_blob(handler, start_front_door, caplog, payload, named):
    front = start_front_door(**WAITING)

    with caplog.at_level(logging.INFO, logger="function_app.blueprints"):
        handler(BLOB)(worker_event(payload))

    # The blob, as a person knows the upload; its event id only where the subject names no safe blob name.
    [record] = _events(front)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("function_app.blueprints")]
    assert lines == [f"{named}: {record['decision']} ({record['reason']})"]


def test_a_ledger_failure_raises_so_event_grid_retries(handler, start_front_door, tmp_path):
    front = start_front_door(**WAITING)
    events = tmp_path / "home" / "ledger" / "claims"
    shutil.rmtree(events, ignore_errors=True)
    events.write_text("")  # the ledger cannot write any claim now

    with pytest.raises(OSError):
        handler(BLOB)(worker_event(blob_created()))
    assert _pending(front) == []

    events.unlink()
    events.mkdir()
    handler(BLOB)(worker_event(blob_created()))  # Event Grid's retry
    assert [e["decision"] for e in _events(front)] == ["debounced"]
    assert len(_pending(front)) == 1


# -- HTTP ---------------------------------------------------------------------------------------------------


def test_a_retrain_request_is_accepted_and_can_be_followed(handler, start_front_door):
    front = start_front_door(**WAITING)

    response = _post(handler, b'{"reason": "new labels"}', **{"Idempotency-Key": "labels-2026-11-29"})

    assert response.status_code == 202
    body = _json(response)
    assert body["decision"] == "accepted"
    assert body["status_url"] == f"{FUNCTION_URL}/{body['id']}"
    status = _get(handler, body["id"])
    assert status.status_code == 200
    assert _json(status) | {"reason": None} == {
        "id": body["id"],
        "decision": "accepted",
        "reason": None,
        "submission": None,
    }

    # A retry with the same key and body gets the first answer again (the IETF Idempotency-Key draft).
    again = _post(handler, b'{ "reason":  "new labels" }', **{"Idempotency-Key": "labels-2026-11-29"})
    assert (again.status_code, _json(again)) == (202, body)
    [item] = _pending(front)
    assert (item.kind, item.reason) == ("http", "new labels")


def test_a_forced_request_submits_the_pending_data_at_once(handler, start_front_door):
    front = start_front_door(**WAITING, RETRAIN_COOLDOWN_SECONDS="3600")
    handler(BLOB)(worker_event(blob_created()))

    response = _post(handler, b'{"force": true, "reason": "hotfix"}')

    body = _json(response)
    assert (response.status_code, body["decision"]) == (202, "submitted")
    status = _json(_get(handler, body["id"]))
    assert status["submission_status"] == "Completed"
    assert status["job_name"].startswith(f"retrain-{MODEL}-rd-")
    [submission] = front.ledger_snapshot()["submissions"]
    assert (submission["id"], submission["kind"]) == (status["submission"], "http")
    assert submission["inputs"] == [blob_url(NAME)]
    assert _json(_get(handler, submission["id"]))["submission_status"] == "Completed"


@pytest.mark.parametrize(("budget", "status"), [("6", 409), ("1", 429)], ids=["cooldown", "daily-budget"])
def test_a_request_held_back_is_told_when_to_retry(handler, start_front_door, budget, status):
    front = start_front_door(RETRAIN_COOLDOWN_SECONDS="3600", RETRAIN_MAX_RUNS_PER_DAY=budget)
    handler(BLOB)(worker_event(blob_created()))
    assert _post(handler, b'{"force": true}').status_code == 202
    handler(TIMER)(TimerRequest())  # the run ended: only the cooldown or the budget holds back now

    response = _post(handler, b'{"reason": "more data"}')

    assert response.status_code == status
    assert _json(response)["decision"] == "cooldown"
    assert 0 < int(response.headers["Retry-After"]) <= 24 * 3600
    assert [item.reason for item in _pending(front)] == ["more data"]  # kept for the next run


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"retrain please", 400, "not JSON"),
        (b'{"force": "yes"}', 400, "expected true or false"),
        (b'{"data": "file:///etc/passwd"}', 400, "expected a blob folder URL"),
        (b"{" + b" " * MAX_BODY_BYTES + b"}", 413, f"expected at most {MAX_BODY_BYTES}"),
    ],
    ids=["not-json", "force-not-boolean", "local-file", "too-large"],
)
def test_a_bad_request_is_refused_and_recorded(handler, start_front_door, body, status, error):
    front = start_front_door()

    response = _post(handler, body)

    assert response.status_code == status
    assert error in _json(response)["error"]
    assert [(e["kind"], e["decision"]) for e in _events(front)] == [("http", "rejected")]
    assert _pending(front) == []


@pytest.mark.parametrize("identifier", ["k-0000000000000000000000000000000000000000", "not an id!"])
def test_an_unknown_retraining_is_not_found(handler, start_front_door, identifier):
    start_front_door()
    response = _get(handler, identifier)
    assert response.status_code == 404
    assert "no retraining with id" in _json(response)["error"]


# -- timer --------------------------------------------------------------------------------------------------


def test_the_timer_submits_a_quiet_batch_once(handler, start_front_door, caplog):
    front = start_front_door()
    for name in ("batch-0001.csv", "batch-0002.csv"):
        handler(BLOB)(worker_event(blob_created(name=f"{PREFIX}/{name}", envelope={"id": name})))

    with caplog.at_level(logging.INFO, logger="function_app.blueprints.timer"):
        handler(TIMER)(TimerRequest(past_due=True))
        handler(TIMER)(TimerRequest())

    [submission] = front.ledger_snapshot()["submissions"]
    assert sorted(submission["inputs"]) == [
        blob_url(f"{PREFIX}/batch-0001.csv"),
        blob_url(f"{PREFIX}/batch-0002.csv"),
    ]
    assert {(e["decision"], e["submission"]) for e in _events(front)} == {("submitted", submission["id"])}
    late, on_time = (r for r in caplog.records if r.name == "function_app.blueprints.timer")
    assert (late.levelno, late.getMessage()) == (
        logging.WARNING,
        "flush ran late (the host was busy or scaled in); submitted 1 batches",
    )
    assert on_time.getMessage() == "flush submitted 0 batches"
