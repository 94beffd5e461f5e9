"""The loopback Event Grid topic: `retrain drift` publishes to it with azure-eventgrid's client, and the
drift trigger's front door takes the event from it; a wrong key or a bad request delivers nothing."""

from __future__ import annotations

import http.client
import json
import secrets
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest

from function_app.events.drift_alerts import RETRAIN_DRIFT_DETECTED, parse_drift_alert
from function_app.events.triggers import KIND_DRIFT, TriggerRequest
from function_app.local.topic import KEY_HEADER, LocalTopic, LocalTopicError
from training.cli import main
from training.drift.check import compare
from training.drift.publish import PublishError, TopicSettings, drift_event, publish
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.sample_data import write_sample_batches

KEY = secrets.token_urlsafe(32)


class Received:
    """The topic's subscriber in these tests: keeps each event, then hands it on (if anywhere)."""

    def __init__(self, then: Any = None) -> None:
        self.events: list[Mapping[str, Any]] = []
        self._then = then

    def __call__(self, event: Mapping[str, Any]) -> Any:
        self.events.append(event)
        return self._then(event) if self._then else None


@pytest.fixture
def received() -> Received:
    return Received()


@pytest.fixture
def topic(received: Received) -> Iterator[LocalTopic]:
    with LocalTopic(KEY, received, max_body_bytes=4096) as started:
        yield started


def post(topic: LocalTopic, body: bytes, headers: Mapping[str, str], path: str | None = None) -> int:
    address = urlsplit(topic.endpoint)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    try:
        connection.request("POST", path or address.path, body=body, headers=dict(headers))
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def small_event(check_id: str = "drift-test-1") -> Any:
    values = np.arange(50.0)[:, None]
    return drift_event(compare(values, values + 100.0, ["x"]), "digits", check_id)


# -- end to end ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def drift_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a prepared reference data version, a folder of shifted raw batches)."""
    root = tmp_path_factory.mktemp("drift")
    write_sample_batches(root / "raw", batches=2)
    prepare(root / "raw", root / "prepared")
    write_sample_batches(root / "shifted", batches=2, shift=0.5)
    return root / "prepared", root / "shifted"


def test_a_drift_check_publishes_over_loopback_and_the_drift_trigger_accepts_it(
    drift_data, start_front_door, monkeypatch, capsys, caplog, tmp_path
):
    door = start_front_door()
    received = Received(then=lambda event: door.deliver(event, family=KIND_DRIFT))
    prepared, shifted = drift_data
    with LocalTopic(KEY, received) as topic:
        monkeypatch.setenv("RETRAIN_DRIFT_TOPIC_ENDPOINT", topic.endpoint)
        monkeypatch.setenv("RETRAIN_DRIFT_TOPIC_KEY", KEY)
        argv = ["drift", "--model-name", "digits", "--current", str(shifted), "--reference", str(prepared)]
        code = main([*argv, "--mlflow-tracking-uri", "off", "--out", str(tmp_path / "out")])
        outcomes, endpoint = topic.results, topic.endpoint

    assert code == 0
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.endswith(f"published to {endpoint}")
    check_id = json.loads((tmp_path / "out" / "drift.json").read_text())["check_id"]
    (event,) = received.events
    assert (event["eventType"], event["dataVersion"], event["subject"]) == (
        RETRAIN_DRIFT_DETECTED,
        "1",
        "/models/digits/drift",
    )
    assert event["data"]["check_id"] == check_id and len(event["data"]["features"]) == 64
    trigger = parse_drift_alert(event, door.settings, datetime.now(UTC))
    assert isinstance(trigger, TriggerRequest)
    assert trigger.dedupe_key == f"drift:check:{check_id}"
    assert trigger.reason.startswith(f"drift check {check_id}: psi ")
    (outcome,) = outcomes
    assert (outcome.kind, outcome.decision) == (KIND_DRIFT, "accepted")
    assert door.ledger.event(outcome.record_id, ["digits"]).dedupe_key == f"drift:check:{check_id}"
    assert KEY not in caplog.text


def test_a_wrong_key_is_refused_with_401_and_nothing_is_delivered(topic, received):
    wrong = secrets.token_urlsafe(32)

    with pytest.raises(PublishError, match=r"to http://127\.0\.0\.1:\d+/api/events: HTTP 401, ") as raised:
        publish(small_event(), TopicSettings(topic.endpoint, wrong))
    assert wrong not in str(raised.value) and KEY not in str(raised.value)
    assert received.events == []
    assert publish(small_event("drift-test-2"), TopicSettings(topic.endpoint, KEY))
    assert [event["data"]["check_id"] for event in received.events] == ["drift-test-2"]


# -- the publish endpoint --------------------------------------------------------------------------------


def cloud_event() -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "type": RETRAIN_DRIFT_DETECTED,
        "source": "/retrain/drift-check",
        "id": "ce-1",
        "data": {"model_name": "digits", "check_id": "c-1", "metric": "psi", "value": 1.0, "threshold": 0.2},
    }


@pytest.mark.parametrize(
    ("headers", "body", "path", "status"),
    [
        ({}, b"[]", None, 401),
        ({KEY_HEADER: KEY[:-1] + "x"}, b"[]", None, 401),
        ({KEY_HEADER: KEY}, b"[" + b" " * 5000 + b"]", None, 413),
        ({KEY_HEADER: KEY}, b"{not json", None, 400),
        ({KEY_HEADER: KEY}, b"[1]", None, 400),
        ({KEY_HEADER: KEY}, b"[]", "/elsewhere", 404),
    ],
    ids=["no-key", "wrong-key", "too-large", "not-json", "not-events", "wrong-path"],
)
def test_bad_requests_are_answered_and_deliver_nothing(topic, received, headers, body, path, status):
    assert post(topic, body, headers, path) == status
    assert received.events == []


def test_a_body_without_a_length_is_refused(topic, received):
    address = urlsplit(topic.endpoint)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    try:
        connection.putrequest("POST", address.path)
        connection.putheader(KEY_HEADER, KEY)
        connection.endheaders()
        assert connection.getresponse().status == 411
    finally:
        connection.close()
    assert received.events == []


def test_a_cloud_events_batch_is_delivered_in_order(topic, received):
    second = {**cloud_event(), "id": "ce-2"}
    body = json.dumps([cloud_event(), second]).encode()

    assert post(topic, body, {KEY_HEADER: KEY, "Content-Type": "application/cloudevents-batch+json"}) == 200
    assert [event["id"] for event in received.events] == ["ce-1", "ce-2"]


def test_a_failing_subscriber_makes_the_publisher_retry():
    def failing(event: Mapping[str, Any]) -> None:
        raise OSError("the ledger is unreachable")

    with LocalTopic(KEY, failing) as topic:
        assert post(topic, json.dumps([cloud_event()]).encode(), {KEY_HEADER: KEY}) == 503
        assert topic.results == []


def test_the_topic_needs_a_real_key_and_a_start():
    with pytest.raises(LocalTopicError, match="the local topic's key has 5 characters; expected at least 16"):
        LocalTopic("short", Received())
    with pytest.raises(LocalTopicError, match="not started"):
        _ = LocalTopic(KEY, Received()).endpoint
