"""The ledger (function_app/ledger/ledger.py) on the record store, run against the local folder and Blob
Storage (the real Azurite emulator): claims and their tags, the model's state under compare-and-set, the
submission rules, the snapshot, and opening a ledger from its location. The store's own primitives are
tested in test_record_store.py."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta

import pytest
from azure.storage.blob import ContainerClient
from helpers.function_app.corpus import ETAG, PREFIX, blob_created
from helpers.function_app.ledger_harness import (
    MODEL,
    SETTINGS,
    T0,
    blob_request,
    blob_url,
    drift_request,
    http_request,
)

from components.request import COMPLETED, FAILED, QUEUED, RUNNING
from function_app.events.triggers import DEBOUNCED, DUPLICATE, KIND_BLOB, REJECTED, SUBMITTED, TriggerRequest
from function_app.ledger.ledger import Ledger, open_ledger
from function_app.ledger.records import (
    SUBMITTING,
    DuplicateRecord,
    EventRecord,
    InputPin,
    LedgerBusyError,
    LedgerError,
    SubmissionRecord,
    event_id_for_key,
)
from function_app.ledger.store import BlobRecordStore, LocalRecordStore
from function_app.policy.rules import on_arrival, start_submission
from function_app.policy.state import ModelState, PendingItem
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

OTHER = "churn"


@pytest.fixture(params=["local", "blob"])
def backend(request, tmp_path, azurite) -> Iterator[Callable[[], Ledger]]:
    """Opens the same ledger again on each call, as each Function instance would."""
    if request.param == "local":
        yield lambda: Ledger(LocalRecordStore(tmp_path / "ledger"))
        return
    container = azurite.new_container()
    name = container.container_name
    yield lambda: Ledger(
        BlobRecordStore(
            ContainerClient.from_connection_string(azurite.connection_string, name), "retrain/ledger"
        )
    )
    container.delete_container()


@pytest.fixture
def ledger(backend) -> Ledger:
    return backend()


def claim_of(request: TriggerRequest, reason: str = "joined the batch") -> EventRecord:
    return EventRecord.claim(
        request, DEBOUNCED, reason, item=PendingItem.from_request(request, request.received_at)
    )


def submission(sid: str = "sub-1", status: str = SUBMITTING, **changes) -> SubmissionRecord:
    pins = (InputPin(blob_url("a.csv"), "etag:0x8DC1"), InputPin(blob_url("b.csv"), "etag:0x8DC2"))
    fields = {"raw_version": "rd-0123456789abcdef", "inputs": pins, "events": (event_id_for_key("k"),)}
    return SubmissionRecord(sid, MODEL, KIND_BLOB, status, T0, T0, **{**fields, **changes})


def test_an_event_is_claimed_once_and_a_second_claim_is_a_duplicate(backend):
    ledger, other_instance = backend(), backend()
    first = claim_of(blob_request("a.csv"))
    assert ledger.claim(first)
    again = claim_of(blob_request("a.csv", now=T0 + timedelta(seconds=9)), "redelivered")
    assert not other_instance.claim(again)
    stored = other_instance.claim_of(MODEL, first.id)
    assert stored.record == first and stored.pending and stored.version
    assert ledger.event(first.id, [OTHER, MODEL]) == first
    assert ledger.event(first.id, [OTHER]) is None  # a claim is found under its own model only
    assert ledger.event(event_id_for_key("never seen"), [MODEL]) is None


def test_a_claim_needs_a_model_and_an_item_and_deliveries_get_their_own_ids(ledger):
    record = claim_of(drift_request("run-1"))
    for incomplete in (replace(record, item=None), replace(record, model_name=None)):
        with pytest.raises(LedgerError, match="expected a model and a pending item"):
            ledger.claim(incomplete)
    delivery = EventRecord.delivery(KIND_BLOB, REJECTED, "foreign container", T0, event_id="evt-1")
    with pytest.raises(LedgerError, match=r"is not a claim; expected EventRecord\.claim"):
        ledger.claim(delivery)
    assert ledger.snapshot()["events"] == []  # nothing was written by the refused claims
    for _ in range(2):  # the same duplicate delivered twice: both recorded
        ledger.record_delivery(
            EventRecord.delivery(KIND_BLOB, DUPLICATE, "seen", T0, dedupe_key=record.dedupe_key)
        )
    ledger.record_delivery(delivery)
    assert ledger.event(delivery.id, [MODEL]) == delivery
    with pytest.raises(LedgerError, match="expected a fresh id"):
        ledger.record_delivery(delivery)
    events = ledger.snapshot()["events"]
    assert sorted(event["decision"] for event in events) == [DUPLICATE, DUPLICATE, REJECTED]


def test_claims_are_the_models_pending_ones_oldest_first_and_a_retag_takes_them(backend):
    ledger = backend()
    late, early, middle = (drift_request(f"run-{n}", now=T0 + timedelta(seconds=n)) for n in (30, 10, 20))
    for request in (late, early, middle):
        assert ledger.claim(claim_of(request))
    ledger.claim(claim_of(drift_request("other-run", model_name=OTHER)))
    pending = ledger.claims(MODEL)
    assert [claim.record.dedupe_key for claim in pending] == ["drift:run-10", "drift:run-20", "drift:run-30"]
    assert [claim.record.dedupe_key for claim in ledger.claims(OTHER)] == ["drift:other-run"]

    def take(record: EventRecord) -> EventRecord:
        return record.with_decision(SUBMITTED, "quiet for 60 s", submission="sub-1")

    backend().retag(pending[:2], take, "sub-1")  # another instance, holding the flush lease
    assert [claim.record.dedupe_key for claim in ledger.claims(MODEL)] == ["drift:run-30"]
    taken = ledger.claims(MODEL, "sub-1")
    assert [(claim.record.dedupe_key, claim.record.decision) for claim in taken] == [
        ("drift:run-10", SUBMITTED),
        ("drift:run-20", SUBMITTED),
    ]
    assert [claim.record.item for claim in taken] == [claim.record.item for claim in pending[:2]]
    with pytest.raises(LedgerBusyError, match=f"claim {pending[0].record.id} changed under the flush"):
        ledger.retag(pending[:1], take, "sub-2")  # the version read before the first retag
    assert ledger.claim_of(MODEL, pending[0].record.id).tag == "sub-1"
    assert [claim.record.dedupe_key for claim in ledger.claims(OTHER)] == ["drift:other-run"]


def test_state_is_saved_only_over_the_version_read_and_without_its_items(backend):
    ledger = backend()
    state, version = ledger.load_state(MODEL)
    assert state == ModelState.empty(MODEL) and version is None
    _, waiting = on_arrival(state, blob_request("a.csv"), T0, SETTINGS)
    _, waiting = on_arrival(waiting, blob_request("b.csv"), T0, SETTINGS)
    started, _ = start_submission(waiting, "sub-1", T0)
    _, started = on_arrival(started, blob_request("c.csv"), T0, SETTINGS)
    assert started.pending and started.in_flight_items  # items both waiting and riding in sub-1
    assert ledger.save_state(MODEL, started, None)
    assert not backend().save_state(MODEL, started, None)  # someone created it first
    loaded, first = ledger.load_state(MODEL)
    assert loaded == replace(started, pending=(), in_flight_items=())  # the items are the claims
    assert loaded.in_flight_id == "sub-1" and first is not None
    for stored in ledger.store.list("models/"):
        raw = json.loads(ledger.store.read(stored.name).data)["state"]
        assert (raw["pending"], raw["in_flight_items"]) == ([], [])
    finished = replace(loaded, in_flight_id=None, in_flight_since=None, in_flight_kind=None)
    assert ledger.save_state(MODEL, finished, first)
    assert not backend().save_state(MODEL, loaded, first)  # a stale writer cannot undo it
    assert ledger.load_state(MODEL)[0] == finished
    with pytest.raises(LedgerError, match="expected the same model"):
        ledger.save_state(OTHER, finished, None)


def test_a_submission_is_created_once_and_a_finished_one_stays_finished(ledger):
    record = submission()
    assert ledger.create_submission(record)
    assert not ledger.create_submission(submission(status=QUEUED))
    assert ledger.submission("sub-1") == record and ledger.submission("sub-2") is None
    running = record.with_status(
        RUNNING, T0 + timedelta(minutes=1), job_name="retrain-digits-rd-0123456789abcdef"
    )
    assert ledger.update_submission(running)
    done = running.with_status(COMPLETED, T0 + timedelta(minutes=30))
    assert ledger.update_submission(done)
    assert not ledger.update_submission(running.with_status(RUNNING, T0 + timedelta(minutes=31)))
    assert not ledger.update_submission(done.with_status(FAILED, T0 + timedelta(minutes=32)))
    assert ledger.submission("sub-1") == done
    with pytest.raises(LedgerError, match="changes its inputs; a submission's pins are fixed"):
        ledger.update_submission(done.with_status(COMPLETED, T0, inputs=(InputPin(blob_url("x"), "etag:1"),)))
    with pytest.raises(LedgerError, match="submission sub-9 does not exist"):
        ledger.update_submission(submission("sub-9"))


ESTIMATE = {
    "gpus": 1,
    "train_compute": "gpu-spot",
    "tier": "low_priority",
    "wall_hours": 2.25,
    "gpu_hours": 2.25,
    "cost_vs_dedicated": 0.45,
    "cost": None,
    "summary": "estimated cost unpriced: 1 GPU(s) x 2.25 h on low-priority compute gpu-spot = 2.25 GPU-hours",
}


def test_a_submissions_estimate_round_trips_and_stays_as_recorded(ledger):
    record = submission()
    assert ledger.create_submission(record)
    assert ledger.submission("sub-1").estimate is None
    estimated = record.with_estimate(ESTIMATE, T0 + timedelta(seconds=1))
    assert ledger.update_submission(estimated)
    assert ledger.submission("sub-1") == estimated and ledger.submission("sub-1").estimate == ESTIMATE
    queued = estimated.with_status(QUEUED, T0 + timedelta(seconds=2), job_name="retrain-digits-x")
    assert ledger.update_submission(queued)
    assert ledger.submission("sub-1").estimate == ESTIMATE  # a status update keeps it
    assert ledger.snapshot()["submissions"][0]["estimate"] == ESTIMATE
    with pytest.raises(LedgerError, match="changes its estimate; an estimate stays what was expected"):
        ledger.update_submission(queued.with_estimate({**ESTIMATE, "gpus": 8}, T0 + timedelta(seconds=3)))


def test_a_submission_recorded_before_estimates_existed_still_loads(ledger):
    stored = submission().to_dict()
    del stored["estimate"]
    ledger.store.create("submissions/sub-1.json", json.dumps(stored).encode())
    assert ledger.submission("sub-1") == submission()
    with pytest.raises(LedgerError, match="estimate: expected a mapping with a 'summary' line"):
        submission(estimate={"gpus": 1})


def test_a_submission_recorded_with_the_old_data_version_key_still_loads(ledger):
    # Records written before the raw version had its own name keep it under "data_version"; they load as
    # before, and are written back under "raw_version".
    stored = submission().to_dict()
    stored["data_version"] = stored.pop("raw_version")
    ledger.store.create("submissions/sub-1.json", json.dumps(stored).encode())
    loaded = ledger.submission("sub-1")
    assert loaded == submission() and loaded.raw_version == "rd-0123456789abcdef"
    assert "data_version" not in loaded.to_dict() and loaded.to_dict()["raw_version"] == loaded.raw_version


def test_the_snapshot_has_the_shape_retrain_ledger_json_prints(ledger):
    first = claim_of(blob_request("a.csv", now=T0 + timedelta(seconds=1)))
    second = claim_of(blob_request("b.csv", now=T0 + timedelta(seconds=2)))
    for record in (second, first):
        ledger.claim(record)
    ledger.record_delivery(EventRecord.delivery("http", REJECTED, "bad body", T0 - timedelta(seconds=1)))
    ledger.create_submission(submission(events=(first.id,)))
    [taken] = [claim for claim in ledger.claims(MODEL) if claim.record.id == first.id]
    ledger.retag([taken], lambda r: r.with_decision(SUBMITTED, "quiet", submission="sub-1"), "sub-1")
    snapshot = json.loads(json.dumps(ledger.snapshot()))
    assert set(snapshot) == {"events", "duplicates", "submissions", "quarantined"}
    assert snapshot["quarantined"] == [] and snapshot["duplicates"] == []
    assert [event["decision"] for event in snapshot["events"]] == [REJECTED, SUBMITTED, DEBOUNCED]
    assert [event["id"] for event in snapshot["events"][1:]] == [first.id, second.id]  # oldest first
    assert {"id", "kind", "decision", "reason", "submission", "item"} <= set(snapshot["events"][1])
    assert snapshot["events"][1]["submission"] == "sub-1" and snapshot["events"][1]["kind"] == "blob"
    [entry] = snapshot["submissions"]
    assert {"id", "kind", "raw_version", "inputs", "status"} <= set(entry)
    assert entry["inputs"] == [blob_url("a.csv"), blob_url("b.csv")]
    assert entry["pins"][0] == {"url": blob_url("a.csv"), "fingerprint": "etag:0x8DC1"}
    assert (entry["id"], entry["raw_version"], entry["status"]) == (
        "sub-1",
        "rd-0123456789abcdef",
        SUBMITTING,
    )


def test_a_corrupt_record_is_moved_aside_by_every_reader_naming_it(ledger, caplog):
    record = claim_of(blob_request("a.csv"))
    ledger.claim(record)
    ledger.create_submission(submission())
    ledger.save_state(MODEL, ModelState.empty(MODEL), None)
    duplicate = DuplicateRecord.of("evt-second-write", KIND_BLOB, MODEL, T0, record.id)
    assert ledger.record_duplicate(duplicate)
    claim_name = f"claims/{MODEL}/{record.id}.json"
    readers = [
        (f"duplicates/{MODEL}/{duplicate.id}.json", lambda: ledger.snapshot()["duplicates"], []),
        (claim_name, lambda: ledger.claims(MODEL), []),
        (claim_name, lambda: ledger.event(record.id, [MODEL]), None),
        (claim_name, lambda: ledger.snapshot()["events"], []),
        ("submissions/sub-1.json", lambda: ledger.submission("sub-1"), None),
        (f"models/{MODEL}.json", lambda: ledger.load_state(MODEL)[0].model_name, MODEL),
    ]
    caplog.set_level("WARNING")
    for name, read, unreadable in readers:
        stored = ledger.store.read(name)
        if stored is None:  # moved aside by the reader before: damaged afresh
            ledger.store.create(name, b'{"id": "torn')
        else:
            ledger.store.replace(name, b'{"id": "torn', stored.version)
        caplog.clear()
        assert read() == unreadable
        path = f"{ledger.location.rstrip('/')}/{name}"
        line = caplog.records[0].getMessage()
        assert line.startswith(f"ledger record {path} is unreadable (") and "\n" not in line
        assert ledger.store.read(name) is None or name.startswith("models/")  # a state is rebuilt in place
    quarantined = ledger.snapshot()["quarantined"]
    assert {name for name, _, _ in readers} == {
        name for name, _, _ in readers if any(q.startswith(f"quarantine/{name}.") for q in quarantined)
    }


def test_open_ledger_opens_a_folder_and_the_emulator(tmp_path, azurite):
    record = claim_of(http_request("k"))
    local = open_ledger(str(tmp_path / "deep" / "ledger"))
    assert isinstance(local.store, LocalRecordStore) and local.claim(record)
    assert (tmp_path / "deep" / "ledger" / "claims" / MODEL / f"{record.id}.json").is_file()
    container = azurite.new_container()
    try:
        url = f"{azurite.container_url(container.container_name)}/retrain/ledger/"
        remote = open_ledger(url, azurite.connection_string)
        assert isinstance(remote.store, BlobRecordStore) and remote.claim(record)
        assert [blob.name for blob in container.list_blobs()] == [
            f"retrain/ledger/claims/{MODEL}/{record.id}.json"
        ]
        assert azurite.account_key not in remote.location
    finally:
        container.delete_container()


@pytest.mark.parametrize(
    ("spec", "with_key", "message"),
    [
        ("", False, "ledger location is empty"),
        ("s3://bucket/ledger", False, "scheme 's3' is not supported"),
        ("http://127.0.0.1:10000/devacct/ledger", False, "needs a connection string"),
        ("https://prodacct.blob.core.windows.net/ledger", True, "expected no storage connection string"),
        (
            "https://prodacct.blob.core.windows.net/ledger?sv=1&sig=SECRETSIG",
            False,
            "credentials do not belong",
        ),
        ("https://user:SECRETPW@prodacct.blob.core.windows.net/ledger", False, "credentials do not belong"),
        ("https://prodacct.example.com/ledger", False, "neither an Azure Blob Storage account"),
        ("https://prodacct.blob.core.windows.net/Bad_Container", False, "is not a container name"),
        ("https://prodacct.blob.core.windows.net/ledger/../up", False, "the prefix '../up'"),
        ("http://127.0.0.1:10000/otheracct/ledger", True, "is for account"),
    ],
)
def test_open_ledger_refuses_what_it_cannot_use_without_echoing_secrets(spec, with_key, message, azurite):
    with pytest.raises(LedgerError, match="expected") as caught:
        open_ledger(spec, azurite.connection_string if with_key else None)
    text = str(caught.value)
    assert message in text and "\n" not in text
    assert "SECRET" not in text and azurite.account_key not in text


def test_a_malformed_connection_string_is_refused_without_quoting_it():
    with pytest.raises(LedgerError, match="connection string is malformed") as caught:
        open_ledger("http://127.0.0.1:10000/devacct/ledger", "AccountKey=SECRETKEY;garbage")
    assert "SECRETKEY" not in str(caught.value)


# -- every event has a record: duplicates ---------------------------------------------------------------


class CountingStore:
    """The record store seam with its writes counted: each create or replace asked (`asked`), and each that
    wrote (`wrote`); and its reads of claims (`claim_reads`); everything else passes through."""

    def __init__(self, store) -> None:
        self._store = store
        self.location = store.location
        self.asked = self.wrote = self.claim_reads = 0

    def read(self, name: str):
        self.claim_reads += name.startswith("claims/")
        return self._store.read(name)

    def _count(self, done: bool) -> bool:
        self.asked += 1
        self.wrote += bool(done)
        return done

    def create(self, name: str, data: bytes, tag: str = "") -> bool:
        return self._count(self._store.create(name, data, tag))

    def replace(self, name: str, data: bytes, version: str, tag: str = "") -> bool:
        return self._count(self._store.replace(name, data, version, tag))

    def __getattr__(self, name: str):
        return getattr(self._store, name)


NEXT_ETAG = "0x8DE2F4C1A2B3C4E"
# (event id, blob, eTag, what it is, write requests asked, of which wrote): a storm of first arrivals,
# redeliveries of them, second write events for the same blob version, and redeliveries of those. A lost
# claim is never read: a redelivery of a claim's own event leaves one note beside it, which the ledger's
# view folds into the claim.
STORM = [
    ("a-1", "a.csv", ETAG, "first", 1, 1),
    ("a-2", "a.csv", ETAG, "second write", 2, 1),  # the lost claim, then its own record
    ("a-1", "a.csv", ETAG, "redelivery of a claim", 2, 1),  # the lost claim, then its note
    ("b-1", "b.csv", ETAG, "first", 1, 1),
    ("a-2", "a.csv", ETAG, "redelivery of a duplicate", 2, 0),
    ("a-3", "a.csv", ETAG, "third write", 2, 1),
    ("b-2", "b.csv", ETAG, "second write", 2, 1),
    ("a-4", "a.csv", NEXT_ETAG, "first (a new version)", 1, 1),
    ("b-2", "b.csv", ETAG, "redelivery of a duplicate", 2, 0),
    ("b-1", "b.csv", ETAG, "redelivery of a claim", 2, 1),
    ("a-3", "a.csv", ETAG, "redelivery of a duplicate", 2, 0),
    ("a-1", "a.csv", ETAG, "redelivery of a claim, again", 2, 0),  # its note is there already
]


def test_a_storm_leaves_one_record_per_event_id_each_duplicate_naming_its_claim(
    backend, tmp_path, app_settings
):
    environ = app_settings(tmp_path / "home")
    front = build_front_door(AppSettings.from_environ(environ), environ, clock=lambda: T0)
    store = CountingStore(backend().store)
    front.ledger.store = store  # the front door's ledger, on this backend's store, counted
    for event_id, blob, etag, what, asked, wrote in STORM:
        before = (store.asked, store.wrote)
        outcome = front.deliver(blob_created(name=f"{PREFIX}/{blob}", eTag=etag, envelope={"id": event_id}))
        assert (store.asked - before[0], store.wrote - before[1]) == (asked, wrote), f"{event_id}: {what}"
        assert (outcome.decision == DUPLICATE) == (not what.startswith("first")), event_id
    assert store.claim_reads == 0  # a duplicate costs its writes, and no read

    snapshot = json.loads(json.dumps(front.ledger.snapshot()))
    claims, duplicates = snapshot["events"], snapshot["duplicates"]
    records = Counter(record["event_id"] for record in claims + duplicates)
    assert records == Counter({event_id: 1 for event_id, *_ in STORM})  # one record per event id
    claim_of_event = {claim["event_id"]: claim["id"] for claim in claims}
    assert sorted(claim_of_event) == ["a-1", "a-4", "b-1"]
    assert {d["event_id"]: d["duplicate_of"] for d in duplicates} == {
        "a-2": claim_of_event["a-1"],
        "a-3": claim_of_event["a-1"],
        "b-2": claim_of_event["b-1"],
    }
    assert {(d["kind"], d["model_name"], d["received_at"]) for d in duplicates} == {
        (KIND_BLOB, MODEL, T0.isoformat())
    }

    # An HTTP retry (same Idempotency-Key and body) is a new request id: recorded as a duplicate too.
    body, headers = b'{"reason": "operator"}', {"Idempotency-Key": "op-1"}
    first, retry = (front.retrain(body, headers).body["id"] for _ in range(2))
    http = [d for d in front.ledger.snapshot()["duplicates"] if d["kind"] == "http"]
    assert first == retry and [d["duplicate_of"] for d in http] == [first]
