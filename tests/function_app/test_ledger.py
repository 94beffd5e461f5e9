"""The ledger's protocol, run against the local folder and Blob Storage (the real Azurite emulator): claims,
compare-and-set, the update rules, the snapshot, races between threads (and, locally, processes), and the
errors of a ledger that cannot be used."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.storage.blob import ContainerClient
from ledger_harness import (
    CLAIM_ROUNDS,
    MODEL,
    SETTINGS,
    T0,
    add_in_process,
    add_with_retries,
    blob_request,
    blob_url,
    claim_in_process,
    drift_request,
    http_request,
    run_processes,
)

from components.request import COMPLETED, FAILED, QUEUED, RUNNING
from function_app.events.triggers import ACCEPTED, DEBOUNCED, DUPLICATE, KIND_BLOB, REJECTED, SUBMITTED
from function_app.ledger.blob import BlobLedger
from function_app.ledger.local import (
    SUBMITTING,
    EventRecord,
    InputPin,
    Ledger,
    LedgerError,
    LocalLedger,
    SubmissionRecord,
    event_id_for_key,
    open_ledger,
)
from function_app.policy.rules import ModelState, on_arrival, start_submission

THREADS = 8


@pytest.fixture(params=["local", "blob"])
def backend(request, tmp_path, azurite) -> Iterator[Callable[[], Ledger]]:
    """Opens the same ledger again on each call, as each Function instance would."""
    if request.param == "local":
        yield lambda: LocalLedger(tmp_path / "ledger")
        return
    container = azurite.new_container()
    yield lambda: BlobLedger(
        ContainerClient.from_connection_string(azurite.connection_string, container.container_name),
        "retrain/ledger",
    )
    container.delete_container()


@pytest.fixture
def ledger(backend) -> Ledger:
    return backend()


def submission(sid: str = "sub-1", status: str = SUBMITTING, **changes) -> SubmissionRecord:
    pins = (InputPin(blob_url("a.csv"), "etag:0x8DC1"), InputPin(blob_url("b.csv"), "etag:0x8DC2"))
    fields = {"data_version": "rd-0123456789abcdef", "inputs": pins, "events": (event_id_for_key("k"),)}
    return SubmissionRecord(sid, MODEL, KIND_BLOB, status, T0, T0, **{**fields, **changes})


def run_threads(count: int, work: Callable[[int], object]) -> list[object]:
    barrier, results, errors = threading.Barrier(count), [None] * count, []

    def worker(index: int) -> None:
        try:
            barrier.wait(30)
            results[index] = work(index)
        except BaseException as err:  # reported to the test below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    return results


def test_an_event_is_claimed_once_and_a_second_claim_is_a_duplicate(ledger):
    request = blob_request("a.csv")
    first = EventRecord.claim(request, DEBOUNCED, "joined the batch")
    assert ledger.claim_event(first)
    again = EventRecord.claim(blob_request("a.csv", now=T0 + timedelta(seconds=9)), DEBOUNCED, "redelivered")
    assert not ledger.claim_event(again)
    assert ledger.event(first.id) == first
    assert ledger.event(event_id_for_key("never seen")) is None


def test_only_claim_records_can_claim_and_deliveries_get_their_own_ids(ledger):
    delivery = EventRecord.delivery(KIND_BLOB, REJECTED, "foreign container", T0, event_id="evt-1")
    with pytest.raises(LedgerError, match=r"is not a claim; expected EventRecord\.claim"):
        ledger.claim_event(delivery)
    request = drift_request("run-1")
    ledger.claim_event(EventRecord.claim(request, ACCEPTED, "new alert"))
    for _ in range(2):  # the same duplicate delivered twice: both recorded
        ledger.record_event(
            EventRecord.delivery(KIND_BLOB, DUPLICATE, "seen", T0, dedupe_key=request.dedupe_key)
        )
    ledger.record_event(delivery)
    events = ledger.snapshot()["events"]
    assert sorted(event["decision"] for event in events) == [ACCEPTED, DUPLICATE, DUPLICATE, REJECTED]
    assert len({event["id"] for event in events}) == 4
    with pytest.raises(LedgerError, match="expected a fresh id"):
        ledger.record_event(delivery)


def test_an_event_update_records_its_submission_and_is_never_taken_back(ledger):
    claim = EventRecord.claim(blob_request("a.csv"), DEBOUNCED, "joined the batch")
    ledger.claim_event(claim)
    submitted = claim.with_decision(SUBMITTED, "quiet for 60 s", submission="sub-1")
    assert ledger.update_event(submitted)
    # A slower instance, still holding the older view, must not undo it.
    assert not ledger.update_event(claim.with_decision(DEBOUNCED, "late writer"))
    assert ledger.event(claim.id) == submitted
    with pytest.raises(LedgerError, match="changes its event_id"):
        ledger.update_event(EventRecord.from_dict({**submitted.to_dict(), "event_id": "other"}))
    with pytest.raises(LedgerError, match="does not exist"):
        ledger.update_event(EventRecord.claim(blob_request("zzz.csv"), DEBOUNCED, "x"))


def test_a_redelivery_applies_a_claim_whose_claimer_stopped_before_saving_the_state(ledger):
    request = drift_request("run-1")
    claim = EventRecord.claim(request, ACCEPTED, "new alert")
    assert ledger.claim_event(claim)  # ... and the instance dies here, before on_arrival and save_state
    assert not ledger.claim_event(EventRecord.claim(request, ACCEPTED, "redelivered"))
    stored = ledger.event(claim.id)
    assert stored is not None and stored.needs_apply
    add_with_retries(ledger, request)
    assert ledger.update_event(stored.with_decision(ACCEPTED, "new alert"))
    assert not ledger.event(claim.id).needs_apply
    assert not ledger.update_event(claim)  # a late writer cannot mark it unapplied again
    assert [item.dedupe_key for item in ledger.load_state(MODEL)[0].pending] == [request.dedupe_key]


def test_state_is_saved_only_over_the_version_that_was_read(ledger):
    state, token = ledger.load_state(MODEL)
    assert state == ModelState.empty(MODEL) and token is None
    _, first = on_arrival(state, blob_request("a.csv"), T0, SETTINGS)
    assert ledger.save_state(MODEL, first, None)
    assert not ledger.save_state(MODEL, first, None)  # someone created it first
    loaded, token_1 = ledger.load_state(MODEL)
    assert loaded == first and token_1 is not None
    _, second = on_arrival(loaded, blob_request("b.csv"), T0, SETTINGS)
    assert ledger.save_state(MODEL, second, token_1)
    _, stale = on_arrival(loaded, blob_request("c.csv"), T0, SETTINGS)
    assert not ledger.save_state(MODEL, stale, token_1)  # lost race: c.csv must be reapplied
    assert [item.dedupe_key for item in ledger.load_state(MODEL)[0].pending] == [
        blob_request("a.csv").dedupe_key,
        blob_request("b.csv").dedupe_key,
    ]
    with pytest.raises(LedgerError, match="expected the same model"):
        ledger.save_state("other", second, None)


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


def test_a_submission_recorded_before_estimates_existed_still_loads():
    stored = submission().to_dict()
    del stored["estimate"]
    assert SubmissionRecord.from_dict(stored) == submission()
    with pytest.raises(LedgerError, match="estimate: expected a mapping with a 'summary' line"):
        submission(estimate={"gpus": 1})


def test_the_snapshot_has_the_shape_retrain_ledger_json_prints(ledger):
    request = blob_request("a.csv")
    claim = EventRecord.claim(request, DEBOUNCED, "joined the batch")
    ledger.claim_event(claim)
    ledger.record_event(EventRecord.delivery("http", REJECTED, "bad body", T0 - timedelta(seconds=1)))
    ledger.create_submission(submission(events=(claim.id,)))
    ledger.update_event(claim.with_decision(SUBMITTED, "quiet", submission="sub-1"))
    snapshot = json.loads(json.dumps(ledger.snapshot()))
    assert set(snapshot) == {"events", "submissions"}
    assert [event["decision"] for event in snapshot["events"]] == [REJECTED, SUBMITTED]  # oldest first
    assert {"id", "kind", "decision", "reason", "submission"} <= set(snapshot["events"][1])
    assert snapshot["events"][1]["submission"] == "sub-1" and snapshot["events"][1]["kind"] == "blob"
    [entry] = snapshot["submissions"]
    assert {"id", "kind", "data_version", "inputs", "status"} <= set(entry)
    assert entry["inputs"] == [blob_url("a.csv"), blob_url("b.csv")]
    assert entry["pins"][0] == {"url": blob_url("a.csv"), "fingerprint": "etag:0x8DC1"}
    assert (entry["id"], entry["data_version"], entry["status"]) == (
        "sub-1",
        "rd-0123456789abcdef",
        SUBMITTING,
    )


def test_racing_instances_claim_each_event_exactly_once(backend):
    ledgers = [backend() for _ in range(THREADS)]
    records = [EventRecord.claim(http_request(f"key-{n}"), ACCEPTED, "asked") for n in range(CLAIM_ROUNDS)]
    results = run_threads(THREADS, lambda index: [ledgers[index].claim_event(record) for record in records])
    assert [sum(won[n] for won in results) for n in range(CLAIM_ROUNDS)] == [1] * CLAIM_ROUNDS


def test_racing_compare_and_set_updates_lose_nothing(backend):
    per_thread = 3
    ledgers = [backend() for _ in range(THREADS)]

    def add_items(index: int) -> int:
        requests = [drift_request(f"t{index}-{n}") for n in range(per_thread)]
        return sum(add_with_retries(ledgers[index], request) for request in requests)

    attempts = run_threads(THREADS, add_items)
    pending = backend().load_state(MODEL)[0].pending
    assert len(pending) == THREADS * per_thread
    assert {item.dedupe_key for item in pending} == {
        f"drift:t{index}-{n}" for index in range(THREADS) for n in range(per_thread)
    }
    assert sum(attempts) >= THREADS * per_thread


def test_racing_flushes_start_one_submission(backend):
    ledger = backend()
    add_with_retries(ledger, drift_request("run-1"))
    ledgers = [backend() for _ in range(THREADS)]

    def flush(index: int) -> bool:
        state, token = ledgers[index].load_state(MODEL)
        if state.in_flight_id is not None:
            return False
        started, _ = start_submission(state, f"sub-{index}", T0)
        return ledgers[index].save_state(MODEL, started, token)

    winners = [index for index, won in enumerate(run_threads(THREADS, flush)) if won]
    assert len(winners) == 1
    assert ledger.load_state(MODEL)[0].in_flight_id == f"sub-{winners[0]}"


def test_processes_racing_on_a_local_ledger_claim_once_and_lose_no_update(tmp_path):
    folder = str(tmp_path / "ledger")
    claims = [won for _, won in run_processes(claim_in_process, [(folder, worker) for worker in range(6)])]
    assert [sum(won[n] for won in claims) for n in range(CLAIM_ROUNDS)] == [1] * CLAIM_ROUNDS
    run_processes(add_in_process, [(folder, worker, 4) for worker in range(6)])
    pending = LocalLedger(Path(folder)).load_state(MODEL)[0].pending
    assert len(pending) == 24 and len({item.dedupe_key for item in pending}) == 24


def test_local_readers_never_see_half_a_record(tmp_path):
    ledger = LocalLedger(tmp_path / "ledger")
    big = ModelState.empty(MODEL)
    for index in range(300):  # a state of tens of kilobytes: written in several syscalls
        _, big = on_arrival(big, blob_request(f"{index:04d}.csv"), T0, SETTINGS)
    small = ModelState.empty(MODEL)
    ledger.save_state(MODEL, small, None)
    stop, seen, errors = threading.Event(), set(), []

    def read() -> None:
        while not stop.is_set():
            try:
                seen.add(len(ledger.load_state(MODEL)[0].pending))
            except LedgerError as err:  # a torn record does not parse
                errors.append(err)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(30):
            for state in (big, small):
                assert ledger.save_state(MODEL, state, ledger.load_state(MODEL)[1])
    finally:
        stop.set()
        reader.join(30)
    assert errors == []
    assert seen <= {0, 300} and seen
    assert not [path for path in (tmp_path / "ledger").rglob(".tmp-*")]  # no temporary file left behind


def test_a_corrupt_record_is_reported_by_name(ledger, azurite, tmp_path):
    claim = EventRecord.claim(blob_request("a.csv"), DEBOUNCED, "joined")
    ledger.claim_event(claim)
    if isinstance(ledger, LocalLedger):
        (tmp_path / "ledger" / "events" / f"{claim.id}.json").write_text('{"id": "torn')
    else:
        location = ledger.location.removeprefix(azurite.blob_endpoint + "/")
        container_name, prefix = location.split("/", 1)
        container = azurite.service_client().get_container_client(container_name)
        container.upload_blob(f"{prefix}events/{claim.id}.json", b"[1, 2", overwrite=True)
    with pytest.raises(LedgerError, match=rf"ledger record .*{claim.id}\.json is unreadable") as caught:
        ledger.snapshot()
    assert "\n" not in str(caught.value)


def test_a_missing_container_is_a_clear_error(azurite):
    container = ContainerClient.from_connection_string(azurite.connection_string, "no-such-ledger")
    with pytest.raises(LedgerError, match="does not exist; create it first") as caught:
        BlobLedger(container, "ledger").load_state(MODEL)
    assert azurite.account_key not in str(caught.value)


def test_a_transient_storage_failure_raises_for_event_grid_to_retry(azurite):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}/{azurite.account}"
    dead = azurite.connection_string.replace(azurite.blob_endpoint, endpoint)
    container = ContainerClient.from_connection_string(dead, "ledger", retry_total=0)
    with pytest.raises(ServiceRequestError):
        BlobLedger(container).claim_event(EventRecord.claim(drift_request("run-1"), ACCEPTED, "new"))


def test_open_ledger_opens_a_folder_and_the_emulator(tmp_path, azurite):
    local = open_ledger(str(tmp_path / "deep" / "ledger"))
    assert isinstance(local, LocalLedger) and local.claim_event(
        EventRecord.claim(http_request("k"), ACCEPTED, "")
    )
    container = azurite.new_container()
    try:
        url = f"{azurite.container_url(container.container_name)}/retrain/ledger/"
        remote = open_ledger(url, azurite.connection_string)
        assert isinstance(remote, BlobLedger)
        assert remote.claim_event(EventRecord.claim(http_request("k"), ACCEPTED, ""))
        names = [blob.name for blob in container.list_blobs()]
        assert names == [f"retrain/ledger/events/{event_id_for_key('http:k')}.json"]
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
