"""The record store (function_app/ledger/store.py), run against the local folder and Blob Storage (the real
Azurite emulator): create-if-absent, compare-and-set replace, tags and listings, the single-writer hold,
races between threads (and, locally, processes), and the errors of a store that cannot be used."""

from __future__ import annotations

import multiprocessing
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.storage.blob import BlobLeaseClient, ContainerClient
from helpers.function_app.ledger_harness import (
    CREATE_ROUNDS,
    RESULT_TIMEOUT_S,
    create_in_process,
    hold_in_process,
    run_processes,
)

from core.storage import blob
from core.storage.records import UNREADABLE, Listed
from function_app.ledger.records import LedgerError
from function_app.ledger.store import BlobRecordStore, LocalRecordStore, RecordStore, quarantine_name

THREADS = 8
PREFIX = "retrain/ledger"


@dataclass
class Backend:
    """One store, opened afresh on each call to `open` (as each Function instance would), and `raw_write`,
    which writes a record's stored form past the store (to corrupt it)."""

    kind: str
    open: Callable[[], RecordStore]
    raw_write: Callable[[str, bytes], None]
    container: ContainerClient | None = None


@pytest.fixture(params=["local", "blob"])
def backend(request, tmp_path, azurite) -> Iterator[Backend]:
    if request.param == "local":
        folder = tmp_path / "ledger"

        def write(name: str, raw: bytes) -> None:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(raw)

        yield Backend("local", lambda: LocalRecordStore(folder), write)
        return
    container = azurite.new_container()
    name = container.container_name
    yield Backend(
        "blob",
        lambda: BlobRecordStore(
            ContainerClient.from_connection_string(azurite.connection_string, name), PREFIX
        ),
        lambda record, raw: container.upload_blob(f"{PREFIX}/{record}", raw, overwrite=True),
        container,
    )
    container.delete_container()


@pytest.fixture
def store(backend) -> RecordStore:
    return backend.open()


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


def test_a_record_is_created_once_and_read_with_its_version_and_tag(store):
    assert store.read("models/digits.json") is None
    assert store.create("models/digits.json", b'{"a":1}\n', "pending-0")
    assert not store.create("models/digits.json", b"other", "x")  # another writer got there first
    stored = store.read("models/digits.json")
    assert (stored.data, stored.tag) == (b'{"a":1}\n', "pending-0") and stored.version
    untagged = store.create("deliveries/d-1.json", b"")
    assert untagged and store.read("deliveries/d-1.json").tag == ""
    with pytest.raises(LedgerError, match=r"record name '\.\./up\.json': expected"):
        store.create("../up.json", b"x")
    with pytest.raises(LedgerError, match=r"tag 'a b': expected"):
        store.create("ok.json", b"x", "a b")


def test_a_replace_needs_the_current_version_and_a_stale_one_keeps_the_record(store):
    store.create("models/digits.json", b"first", "one")
    first = store.read("models/digits.json")
    assert store.replace("models/digits.json", b"second", first.version, "two")
    second = store.read("models/digits.json")
    assert (second.data, second.tag) == (b"second", "two") and second.version != first.version
    assert not store.replace("models/digits.json", b"late writer", first.version, "three")
    assert store.read("models/digits.json") == second
    assert not store.replace("models/absent.json", b"x", first.version)
    assert store.read("models/absent.json") is None
    assert store.replace("models/digits.json", b"third", second.version)  # "" clears the tag
    assert store.read("models/digits.json").tag == ""


def test_a_listing_gives_names_versions_and_tags_of_exactly_its_prefix(store):
    for name, tag in [("claims/a/k-1.json", ""), ("claims/a/k-2.json", "sub-1"), ("claims/ab/k-3.json", "")]:
        store.create(name, name.encode(), tag)
    store.create("submissions/sub-1.json", b"{}")
    listed = sorted(store.list("claims/a/"), key=lambda entry: entry.name)
    assert [(entry.name, entry.tag) for entry in listed] == [
        ("claims/a/k-1.json", ""),
        ("claims/a/k-2.json", "sub-1"),
    ]
    assert [entry.version for entry in listed] == [store.read(entry.name).version for entry in listed]
    assert list(store.list("claims/none/")) == []
    # A prefix is a prefix of names, in both twins, not only a folder.
    assert {entry.name for entry in store.list("claims/a")} == {
        "claims/a/k-1.json",
        "claims/a/k-2.json",
        "claims/ab/k-3.json",
    }
    with store.hold("flush-a"):  # the lease's own record is not a record of any area
        assert {entry.name for entry in store.list("claims/")} == {
            "claims/a/k-1.json",
            "claims/a/k-2.json",
            "claims/ab/k-3.json",
        }
    moved = store.read("claims/a/k-1.json")
    store.replace("claims/a/k-1.json", b"taken", moved.version, "sub-2")
    assert Listed("claims/a/k-1.json", store.read("claims/a/k-1.json").version, "sub-2") in list(
        store.list("claims/a/")
    )


def test_racing_writers_create_each_record_once_and_replace_each_version_once(backend):
    stores = [backend.open() for _ in range(THREADS)]
    names = [f"claims/digits/k-{n}.json" for n in range(CREATE_ROUNDS)]
    results = run_threads(THREADS, lambda i: [stores[i].create(name, str(i).encode()) for name in names])
    winners = [[i for i in range(THREADS) if results[i][n]] for n in range(CREATE_ROUNDS)]
    assert [len(won) for won in winners] == [1] * CREATE_ROUNDS
    assert [stores[0].read(name).data for name in names] == [str(won[0]).encode() for won in winners]
    version = stores[0].read(names[0]).version
    replaced = run_threads(THREADS, lambda i: stores[i].replace(names[0], f"r{i}".encode(), version, "t"))
    [winner] = [i for i in range(THREADS) if replaced[i]]
    assert stores[0].read(names[0]).data == f"r{winner}".encode()


def test_processes_racing_on_a_local_store_create_each_record_once(tmp_path):
    folder = str(tmp_path / "ledger")
    outcomes = dict(run_processes(create_in_process, [(folder, worker) for worker in range(4)]))
    winners = [[w for w, won in outcomes.items() if won[n]] for n in range(CREATE_ROUNDS)]
    assert [len(won) for won in winners] == [1] * CREATE_ROUNDS
    store = LocalRecordStore(Path(folder))
    for n, [worker] in enumerate(winners):
        stored = store.read(f"race/r-{n}.json")
        assert (stored.data, stored.tag) == (str(worker).encode(), f"w{worker}")


def test_readers_never_see_half_a_record(backend):
    store = backend.open()
    big, small = b"B" * 512 * 1024, b"small"  # big: written in many syscalls locally, many packets to Azure
    store.create("models/digits.json", small)
    stop, seen, errors = threading.Event(), set(), []

    def read() -> None:
        reader = backend.open()
        while not stop.is_set():
            try:
                seen.add(reader.read("models/digits.json").data)
            except BaseException as err:  # reported below
                errors.append(err)
                return

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for _ in range(15):
            for data in (big, small):
                assert store.replace("models/digits.json", data, store.read("models/digits.json").version)
    finally:
        stop.set()
        thread.join(30)
    assert errors == []
    assert seen <= {big, small} and seen
    if backend.kind == "local":  # no temporary file left behind
        assert [path.name for path in (Path(store.location)).rglob("*.tmp")] == []


def test_a_local_record_without_its_tag_line_is_read_and_listed_as_unreadable(tmp_path):
    store = LocalRecordStore(tmp_path / "ledger")
    (tmp_path / "ledger" / "models").mkdir()
    (tmp_path / "ledger" / "models" / "digits.json").write_bytes(b'{"state": "torn')
    stored = store.read("models/digits.json")
    assert (stored.data, stored.tag) == (b'{"state": "torn', UNREADABLE)
    assert [(entry.name, entry.tag) for entry in store.list("models/")] == [
        ("models/digits.json", UNREADABLE)
    ]
    moved = store.quarantine("models/digits.json", stored.version)
    assert moved == quarantine_name("models/digits.json", stored.version)
    assert store.read("models/digits.json") is None and store.read(moved).data == b'{"state": "torn'
    assert store.quarantine("models/digits.json", stored.version) == moved  # moved already: the same place


def test_a_record_changed_since_it_was_read_is_not_moved_aside(backend):
    store = backend.open()
    store.create("claims/digits/k-1.json", b"{torn")
    old = store.read("claims/digits/k-1.json").version
    store.replace("claims/digits/k-1.json", b"{}", old)
    assert store.quarantine("claims/digits/k-1.json", old) is None
    assert store.read("claims/digits/k-1.json").data == b"{}"
    assert list(store.list("quarantine/")) == []


def test_a_hold_is_had_once_and_again_after_release(backend):
    store, other = backend.open(), backend.open()
    with store.hold("flush-digits") as held:
        assert held is not None and not held.lost
        with other.hold("flush-digits") as second:
            assert second is None
        with other.hold("flush-other") as unrelated:
            assert unrelated is not None
    with other.hold("flush-digits") as again:
        assert again is not None


def test_a_killed_local_holder_releases_its_hold(tmp_path):
    folder = tmp_path / "ledger"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    holder = context.Process(target=hold_in_process, args=(str(folder), "flush-digits", results))
    holder.start()
    try:
        assert results.get(timeout=RESULT_TIMEOUT_S) is True
        store = LocalRecordStore(folder)
        with store.hold("flush-digits") as held:
            assert held is None
    finally:
        holder.kill()  # SIGKILL: no cleanup runs in the holder
        holder.join(30)
    assert holder.exitcode == -signal.SIGKILL
    with store.hold("flush-digits") as held:
        assert held is not None


def test_a_blob_lease_broken_from_outside_is_reported_lost_at_its_next_renewal(azurite):
    container = azurite.new_container()
    try:
        store = BlobRecordStore(container, PREFIX)
        with store.hold("flush-digits") as held:
            assert held is not None and not held.lost
            lease_blob = container.get_blob_client(f"{PREFIX}/{blob.LEASES}/flush-digits")
            BlobLeaseClient(lease_blob).break_lease(lease_break_period=0)
            # The renewal thread ends at the first renewal that fails: wait for it, not for a time.
            held.renewal.thread.join(blob.RECORD_LEASE_SECONDS * 2)
            assert not held.renewal.thread.is_alive() and held.lost
            with store.hold("flush-digits") as taken_over:
                assert taken_over is not None
    finally:
        container.delete_container()


def test_a_missing_container_is_a_clear_one_line_error(azurite):
    store = BlobRecordStore(
        ContainerClient.from_connection_string(azurite.connection_string, "no-such-ledger"), "ledger"
    )
    actions = [
        lambda: store.read("models/digits.json"),
        lambda: store.create("models/digits.json", b"x"),
        lambda: store.replace("models/digits.json", b"x", '"0x1"'),
        lambda: list(store.list("claims/")),
        lambda: store.hold("flush-digits").__enter__(),
    ]
    for action in actions:
        with pytest.raises(
            LedgerError, match="no-such-ledger/ledger/ does not exist; create it first"
        ) as caught:
            action()
        assert "\n" not in str(caught.value) and azurite.account_key not in str(caught.value)


def test_a_transient_storage_failure_raises_its_azure_type_for_event_grid_to_retry(azurite):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dead = azurite.connection_string.replace(
        azurite.blob_endpoint, f"http://127.0.0.1:{port}/{azurite.account}"
    )
    store = BlobRecordStore(ContainerClient.from_connection_string(dead, "ledger", retry_total=0))
    for action in (lambda: store.create("claims/digits/k-1.json", b"x"), lambda: store.read("models/d.json")):
        with pytest.raises(ServiceRequestError):
            action()
