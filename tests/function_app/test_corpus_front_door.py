"""The whole bad-input corpus through the front door itself: each case is rejected with its reason and
recorded, nothing escapes as an exception, nothing is submitted, and the account key never reaches a log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers.function_app.corpus import (
    ENVIRON,
    EVENT_CASES,
    FAKE_ACCOUNT_KEY,
    HTTP_CASES,
    EventCase,
    HttpCase,
)

from function_app.events.triggers import REJECTED
from function_app.service import FrontDoor
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door


@pytest.fixture(scope="module")
def front_door(tmp_path_factory: pytest.TempPathFactory) -> FrontDoor:
    home = tmp_path_factory.mktemp("corpus-front-door")
    environ = {**ENVIRON, "RETRAIN_HOME": str(home), "RETRAIN_LEDGER": str(home / "ledger")}
    environ.pop("RETRAIN_STORAGE_CONNECTION_STRING")  # the ledger is a folder here; the key stays in payloads
    return build_front_door(AppSettings.from_environ(environ), environ)


def test_the_corpus_is_large_enough():
    assert len(EVENT_CASES) + len(HTTP_CASES) >= 30


@pytest.mark.parametrize("case", EVENT_CASES, ids=lambda case: case.name)
def test_every_bad_event_is_rejected_with_its_reason_and_recorded(front_door, case: EventCase, caplog):
    caplog.set_level(logging.DEBUG)
    outcome = front_door.deliver(case.event, family=case.family)
    assert outcome.decision == REJECTED
    assert case.reason in outcome.reason and "\n" not in outcome.reason
    recorded = {event["id"]: event for event in front_door.ledger_snapshot()["events"]}
    assert recorded[outcome.record_id]["decision"] == REJECTED
    assert FAKE_ACCOUNT_KEY not in caplog.text


@pytest.mark.parametrize("case", HTTP_CASES, ids=lambda case: case.name)
def test_every_bad_request_is_answered_with_its_status_and_reason(front_door, case: HttpCase, caplog):
    caplog.set_level(logging.DEBUG)
    answer = front_door.retrain(case.body, case.headers)
    assert answer.status == case.status
    assert case.reason in answer.body["error"]
    assert FAKE_ACCOUNT_KEY not in caplog.text and FAKE_ACCOUNT_KEY not in str(answer.body)


def test_after_the_whole_corpus_nothing_was_submitted(front_door, tmp_path: Path):
    assert front_door.flush(ignore_quiet=True) == []
    snapshot = front_door.ledger_snapshot()
    assert snapshot["submissions"] == []
    assert {event["decision"] for event in snapshot["events"]} == {REJECTED}
