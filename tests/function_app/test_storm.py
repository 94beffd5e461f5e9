"""The storm: 1,000 Blob-created events over 50 blobs (14 versions each, plus 300 redeliveries: 30 %
duplicates), shuffled and delivered by 4 threads at once, with drift alerts and HTTP requests among them,
against a front door whose ledger is in Blob Storage (the real Azurite emulator) and whose clock the test
sets. Flushes run at chosen times, three of them while a wave is being delivered.

The expected submissions are computed from the settings and the schedule alone (`expected_submissions`):
a batch goes when its uploads have been quiet for Q or its first one has waited W, at least C after the
previous submission, and at most B a UTC day. The ledger must then show exactly those submissions, each
blob in exactly one submission's inputs (pinned at its newest version), and a decision for every event.
"""

from __future__ import annotations

import json
import queue
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import AzureError
from helpers.function_app.corpus import (
    CLOUD_EVENTS,
    EVENT_GRID,
    PREFIX,
    blob_created,
    blob_url,
    retrain_drift_detected,
)

from function_app.events.triggers import DECISIONS, KIND_BLOB, KIND_DRIFT, KIND_HTTP
from function_app.ledger.records import LedgerBusyError
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

QUIET, MAX_WAIT, COOLDOWN, BUDGET = 60, 150, 600, 3
T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
BLOBS, VERSIONS, EVENTS, WORKERS = 50, 14, 1000, 4
DELIVERY_ATTEMPTS = 5  # Event Grid retries a delivery that failed transiently
SEED = 20261129


class FakeClock:
    """The front door's clock, set by the test: every reading is the time last set (thread-safe)."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, moment: datetime) -> None:
        with self._lock:
            self._now = moment


@dataclass(frozen=True)
class Delivery:
    """One event (or HTTP request) to deliver; `key` names what it carries, a repeat has the same key."""

    kind: str
    key: str
    payload: dict[str, Any] = field(default_factory=dict)
    duplicate: bool = False


@dataclass(frozen=True)
class Wave:
    """Deliveries made concurrently while the clock reads `at`; `flushes` run concurrently with them."""

    at: datetime
    deliveries: tuple[Delivery, ...]
    concurrent_flushes: int = 0


def _blob_event(blob: int, version: int, rng: random.Random) -> Delivery:
    name = f"{PREFIX}/batch-{blob:02d}.csv"
    schema = CLOUD_EVENTS if rng.random() < 0.3 else EVENT_GRID
    payload = blob_created(
        schema,
        name,
        eTag=_etag(blob, version),
        sequencer=f"{version + 1:032x}",  # one blob's versions in upload order
        contentLength=1024 + version,
        envelope={"id": f"blob-{blob:02d}-v{version:02d}"},
    )
    return Delivery(KIND_BLOB, f"{name}@{version}", payload)


def _etag(blob: int, version: int) -> str:
    return f"0x8DE{blob:04X}{version:06X}"


def _drift(check: str) -> Delivery:
    payload = retrain_drift_detected(check_id=check)
    payload["id"] = f"drift-{check}"
    return Delivery(KIND_DRIFT, check, payload)


def _http(key: str) -> Delivery:
    body = {"reason": f"operator request {key}"}
    return Delivery(KIND_HTTP, key, {"body": body, "headers": {"Idempotency-Key": key}})


def _again(delivery: Delivery) -> Delivery:
    return Delivery(delivery.kind, delivery.key, delivery.payload, duplicate=True)


@dataclass(frozen=True)
class Schedule:
    waves: tuple[Wave, ...]
    flushes: tuple[datetime, ...]
    phase_of_blob: dict[int, int]


def build_schedule(rng: random.Random) -> Schedule:
    """Four phases. Blobs 0-16 arrive in waves 50 s apart (the quiet period never passes: the maximum
    wait sends them); blobs 17-33 while the first run is in flight; blobs 34-49 during the cooldown after
    the second; the last phase brings only drift alerts and requests, after the day's budget is spent."""
    groups = (range(0, 17), range(17, 34), range(34, 50), range(0))
    offsets = ((0, 50, 100, 140), (200,), (800, 830), (1400,))
    extras = (
        [_drift("check-1"), _drift("check-2"), _http("req-1"), _http("req-2")],
        [_drift("check-3"), _http("req-3")],
        [_drift("check-4"), _http("req-4")],
        [_drift("check-5"), _http("req-5")],
    )
    originals = {
        phase: [_blob_event(b, v, rng) for b in group for v in range(VERSIONS)]
        for phase, group in enumerate(groups)
    }
    all_originals = [delivery for phase in originals.values() for delivery in phase]
    phase_of_key = {d.key: phase for phase, ds in originals.items() for d in ds}
    repeats: dict[int, list[Delivery]] = {phase: [] for phase in originals}
    for delivery in rng.choices(all_originals, k=EVENTS - len(all_originals)):
        repeats[phase_of_key[delivery.key]].append(_again(delivery))
    extras[0].extend([_again(extras[0][0]), _again(extras[0][2])])  # a redelivered alert, a repeated key
    waves = []
    for phase, times in enumerate(offsets):
        mixed = originals[phase] + repeats[phase] + extras[phase]
        rng.shuffle(mixed)
        for index, offset in enumerate(times):
            chunk = tuple(mixed[index :: len(times)])
            waves.append(
                Wave(T0 + timedelta(seconds=offset), chunk, concurrent_flushes=3 if phase == 1 else 0)
            )
    flushes = [30, 120, 150, 300, 750, 790, 900, 1350, 1950]
    flush_times = [T0 + timedelta(seconds=s) for s in flushes] + [
        datetime(2026, 11, 30, 0, 0, 10, tzinfo=UTC)
    ]
    phase_of_blob = {blob: phase for phase, group in enumerate(groups) for blob in group}
    return Schedule(tuple(waves), tuple(flush_times), phase_of_blob)


def _seconds(since: datetime, until: datetime) -> float:
    return (until - since).total_seconds()


def expected_submissions(schedule: Schedule) -> list[datetime]:
    """When the settings say a batch is submitted, from the schedule alone: at a flush, if something is
    pending and, were there uploads, they have been quiet for QUIET or the first has waited MAX_WAIT; at
    least COOLDOWN after the previous submission; fewer than BUDGET submissions that UTC day."""
    steps = [(wave.at, 0, wave) for wave in schedule.waves] + [(at, 1, None) for at in schedule.flushes]
    pending, first_blob, last_blob, last_submission = False, None, None, None
    runs: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    submitted = []
    for at, _, wave in sorted(steps, key=lambda step: step[:2]):
        if wave is not None:
            new = {(d.kind, d.key) for d in wave.deliveries} - seen  # a repeat adds nothing to the batch
            seen |= new
            pending = pending or bool(new)
            if any(kind == KIND_BLOB for kind, _ in new):
                first_blob, last_blob = first_blob or at, at
            continue
        debounced = (
            last_blob is None or _seconds(last_blob, at) >= QUIET or _seconds(first_blob, at) >= MAX_WAIT
        )
        cooled = last_submission is None or _seconds(last_submission, at) >= COOLDOWN
        if pending and debounced and cooled and runs[at.date().isoformat()] < BUDGET:
            submitted.append(at)
            runs[at.date().isoformat()] += 1
            pending, first_blob, last_blob, last_submission = False, None, None, at
    return submitted


def _deliver(front, delivery: Delivery) -> tuple[str, str, int | None]:
    """(ledger record id, decision, HTTP status) of one delivery, retried as Event Grid retries."""
    for attempt in range(DELIVERY_ATTEMPTS):
        try:
            if delivery.kind == KIND_HTTP:
                body = json.dumps(delivery.payload["body"]).encode()
                answer = front.retrain(body, delivery.payload["headers"], "http://localhost:7071/api/retrain")
                return answer.body["id"], answer.body["decision"], answer.status
            outcome = front.deliver(delivery.payload, delivery.kind)
            return outcome.record_id, outcome.decision, None
        except (LedgerBusyError, AzureError):
            if attempt == DELIVERY_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _run_wave(front, wave: Wave) -> list[tuple[Delivery, tuple[str, str, int | None]]]:
    """Four workers take the wave's deliveries from one queue; flushers run beside them."""
    work: queue.Queue[Delivery] = queue.Queue()
    for delivery in wave.deliveries:
        work.put(delivery)
    results: list[tuple[Delivery, tuple[str, str, int | None]]] = []
    flushed: list[list[Any]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(WORKERS + wave.concurrent_flushes)

    def worker() -> None:
        start.wait()
        while True:
            try:
                delivery = work.get_nowait()
            except queue.Empty:
                return
            outcome = _deliver(front, delivery)
            with lock:
                results.append((delivery, outcome))

    def flusher() -> None:
        start.wait()
        submitted = front.flush()
        with lock:
            flushed.append(submitted)

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as error:  # re-raised in the test thread below
                with lock:
                    errors.append(error)

        return run

    threads = [threading.Thread(target=guarded(worker)) for _ in range(WORKERS)]
    threads += [threading.Thread(target=guarded(flusher)) for _ in range(wave.concurrent_flushes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a storm worker is stuck"
    if errors:
        raise errors[0]
    assert flushed == [[]] * wave.concurrent_flushes  # in flight or cooling down: nothing may go
    return results


@pytest.fixture
def storm_front_door(azurite, tmp_path):
    container = azurite.new_container()
    environ = {
        "RETRAIN_SUBMITTER": "dry-run",
        "RETRAIN_HOME": str(tmp_path / "home"),
        "RETRAIN_MODEL_NAME": "digits",
        "RETRAIN_BLOB_ACCOUNT": "retraindata",
        "RETRAIN_BLOB_CONTAINER": "landing",
        "RETRAIN_BLOB_PREFIX": f"{PREFIX}/",
        "RETRAIN_LEDGER": f"{azurite.blob_endpoint}/{container.container_name}/front-door",
        "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string,
        "RETRAIN_DEBOUNCE_QUIET_SECONDS": str(QUIET),
        "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": str(MAX_WAIT),
        "RETRAIN_COOLDOWN_SECONDS": str(COOLDOWN),
        "RETRAIN_MAX_RUNS_PER_DAY": str(BUDGET),
    }
    clock = FakeClock(T0)
    yield build_front_door(AppSettings.from_environ(environ), environ, clock=clock), clock
    container.delete_container()


def test_a_storm_of_events_becomes_exactly_the_submissions_the_policy_implies(storm_front_door):
    front, clock = storm_front_door
    schedule = build_schedule(random.Random(SEED))
    blob_events = [d for wave in schedule.waves for d in wave.deliveries if d.kind == KIND_BLOB]
    assert (len(blob_events), sum(d.duplicate for d in blob_events)) == (EVENTS, EVENTS - BLOBS * VERSIONS)
    expected = expected_submissions(schedule)
    assert expected == [T0 + timedelta(seconds=s) for s in (150, 750, 1350)] + [
        datetime(2026, 11, 30, 0, 0, 10, tzinfo=UTC)
    ]

    results, submitted_at = [], []
    steps = [(w.at, 0, w) for w in schedule.waves] + [(at, 1, None) for at in schedule.flushes]
    for at, _, wave in sorted(steps, key=lambda step: step[:2]):
        clock.set(at)
        if wave is not None:
            results += _run_wave(front, wave)
        elif front.flush():
            submitted_at.append(at)

    assert submitted_at == expected
    snapshot = front.ledger_snapshot()
    events = {event["id"]: event for event in snapshot["events"]}
    submissions = snapshot["submissions"]

    # Every event has one claim, and its decision; a redelivery wrote nothing and was told it is a duplicate.
    by_submission = {submission["id"]: submission for submission in submissions}
    deliveries_of: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for delivery, (record_id, decision, _) in results:
        deliveries_of[(delivery.kind, delivery.key)].append((record_id, decision))
    assert len(deliveries_of) == len([d for d, _ in results if not d.duplicate]) == len(events)
    for outcomes in deliveries_of.values():
        [record_id] = {record_id for record_id, _ in outcomes}
        assert record_id.startswith("k-") and events[record_id]["decision"] == "submitted"
        assert events[record_id]["submission"] in by_submission
        decisions = Counter(decision for _, decision in outcomes)
        first_answers = sum(count for decision, count in decisions.items() if decision != "duplicate")
        # An HTTP retry with the same key and body is answered as the first request was.
        assert first_answers == 1 or all(record_id == r for r, _ in outcomes)
        assert all(event["decision"] in DECISIONS for event in events.values())

    # The expected submissions; each blob in exactly one submission's inputs, at its newest version.
    assert [datetime.fromisoformat(s["created_at"]) for s in submissions] == expected
    assert [s["status"] for s in submissions] == ["Completed"] * len(expected)
    pinned = [pin for submission in submissions for pin in submission["pins"]]
    assert sorted(pin["url"] for pin in pinned) == sorted(
        blob_url(f"{PREFIX}/batch-{b:02d}.csv") for b in range(BLOBS)
    )
    assert {pin["url"]: pin["fingerprint"] for pin in pinned} == {
        blob_url(f"{PREFIX}/batch-{b:02d}.csv"): f"etag:{_etag(b, VERSIONS - 1)}" for b in range(BLOBS)
    }
    for phase, submission in enumerate(submissions):
        blobs = sorted(b for b, p in schedule.phase_of_blob.items() if p == phase)
        assert sorted(submission["inputs"]) == [blob_url(f"{PREFIX}/batch-{b:02d}.csv") for b in blobs]
        assert submission["kind"] == KIND_HTTP  # every batch carried an operator's request

    # What the HTTP callers were told: accepted at first; later held back by the cooldown (409) or, once the
    # day's three runs are spent, by the budget (429); never refused. (A dry run ends when it is recorded,
    # so no request finds a run in flight to coalesce with.)
    answers = Counter(
        (d.key, decision, status) for d, (_, decision, status) in results if d.kind == KIND_HTTP
    )
    assert answers[("req-1", "accepted", 202)] == 2  # the retry got the first answer again
    assert {status for (key, _, status) in answers if key != "req-1"} <= {202, 409, 429}
