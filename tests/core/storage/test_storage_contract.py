"""The storage seam's contract (core/storage/), run against both twins through the one registry: a local
folder, and Blob Storage on the real Azurite emulator. Records: create-if-absent (two writers race, one
wins), read with version, replace-if-version, list by prefix, delete. Leases: one holder at a time, who holds
it, and a lost lease noticed. And the registry's scheme rules and Azure's errors, translated once."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError, ServiceRequestError
from azure.storage.blob import BlobLeaseClient, ContainerClient

from core.errors import InputError
from core.storage.azure_errors import describe, is_container_missing, is_transient
from core.storage.blob import LEASES, BlobRecords
from core.storage.leases import read_holder_stamp
from core.storage.local import LocalRecords
from core.storage.locations import CONNECTION_STRING_VARIABLE, open_record_store, parse_location
from core.storage.records import RecordStore

OWNER = "test store"
PREFIX = "seam/records"
RESULT_TIMEOUT_S = 60.0  # a bound on waiting for a thread, never expected to be reached


@dataclass
class Twin:
    """One twin: `open` opens the store afresh through the registry, as each process would."""

    kind: str
    open: Callable[[], RecordStore]
    container: ContainerClient | None = None


@pytest.fixture(params=["local", "blob"])
def twin(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Twin]:
    if request.param == "local":
        spec = f"file://{tmp_path / 'records'}"
        yield Twin("local", lambda: open_record_store(spec, OWNER, InputError, {}))
        return
    azurite = request.getfixturevalue("azurite")
    container = azurite.new_container()
    spec = f"{azurite.container_url(container.container_name)}/{PREFIX}"
    environ = {CONNECTION_STRING_VARIABLE: azurite.connection_string}
    yield Twin("blob", lambda: open_record_store(spec, OWNER, InputError, environ), container)
    container.delete_container()


def race(count: int, work: Callable[[int], object]) -> list[object]:
    """Run `work(i)` on `count` threads released together; their results in order."""
    barrier = threading.Barrier(count)
    results: list[object] = [None] * count

    def run(i: int) -> None:
        barrier.wait(RESULT_TIMEOUT_S)
        results[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RESULT_TIMEOUT_S)
    return results


# -- records ------------------------------------------------------------------------------------------------


def test_the_registry_opens_each_twin_by_its_scheme(twin):
    store = twin.open()
    assert isinstance(store, LocalRecords if twin.kind == "local" else BlobRecords)


def test_two_writers_create_one_name_and_exactly_one_wins(twin):
    stores = [twin.open(), twin.open()]
    won = race(2, lambda i: stores[i].create("claims/k-1.json", f"writer {i}".encode(), "pending"))
    assert sorted(won) == [False, True]
    stored = stores[0].read("claims/k-1.json")
    assert stored is not None and stored.data == f"writer {won.index(True)}".encode()
    assert stored.tag == "pending"


def test_a_record_is_read_with_its_version_which_changes_when_it_is_replaced(twin):
    store = twin.open()
    assert store.read("models/digits.json") is None
    assert store.create("models/digits.json", b"one", "a")
    first = store.read("models/digits.json")
    assert first is not None and (first.data, first.tag) == (b"one", "a")
    assert store.replace("models/digits.json", b"two", first.version, "b")
    second = store.read("models/digits.json")
    assert second is not None and (second.data, second.tag) == (b"two", "b")
    assert second.version != first.version


def test_a_replace_with_a_stale_version_is_refused_and_changes_nothing(twin):
    store, other = twin.open(), twin.open()
    store.create("models/digits.json", b"one")
    stale = store.read("models/digits.json").version
    assert other.replace("models/digits.json", b"theirs", stale)
    assert not store.replace("models/digits.json", b"mine", stale)
    assert store.read("models/digits.json").data == b"theirs"
    assert not store.replace("models/absent.json", b"x", stale)  # nothing there to replace
    # Two writers replacing from one version: one of them wins.
    current = store.read("models/digits.json").version
    stores = [twin.open(), twin.open()]
    assert sorted(race(2, lambda i: stores[i].replace("models/digits.json", b"r", current))) == [False, True]


def test_a_listing_names_every_record_under_a_prefix_with_the_version_a_read_gives(twin):
    store = twin.open()
    for name in ("claims/a1/k.json", "claims/ab.json", "claims/b.json", "models/digits.json"):
        store.create(name, name.encode(), "pending" if name.startswith("claims/a") else "")
    listed = {entry.name: entry for entry in store.list("claims/a")}
    assert sorted(listed) == ["claims/a1/k.json", "claims/ab.json"]  # a prefix of names, not a folder
    for name, entry in listed.items():
        assert entry.tag == "pending" and entry.version == store.read(name).version
    assert [entry.name for entry in store.list("nothing/")] == []


def test_a_delete_removes_a_record_and_a_conditional_one_only_its_version(twin):
    store = twin.open()
    store.create("claims/k-1.json", b"one")
    old = store.read("claims/k-1.json").version
    store.replace("claims/k-1.json", b"two", old)
    assert not store.delete("claims/k-1.json", old)  # changed since: kept
    assert store.read("claims/k-1.json").data == b"two"
    assert store.delete("claims/k-1.json", store.read("claims/k-1.json").version)
    assert store.read("claims/k-1.json") is None
    assert store.delete("claims/k-1.json")  # gone already: done
    store.create("claims/k-2.json", b"x")
    assert store.delete("claims/k-2.json") and store.read("claims/k-2.json") is None


def test_a_bad_name_or_tag_is_refused_in_one_line_naming_the_owner(twin):
    store = twin.open()
    with pytest.raises(InputError, match=f"{OWNER} record name '../up': expected"):
        store.create("../up", b"x")
    with pytest.raises(InputError, match=f"{OWNER} record tag 'a b': expected"):
        store.create("claims/k.json", b"x", "a b")


# -- leases -------------------------------------------------------------------------------------------------


def test_a_lease_has_one_holder_at_a_time_and_names_it(twin):
    first, second = twin.open().lease("flush-digits"), twin.open().lease("flush-digits")
    assert first.holder() is None  # nobody holds it yet
    assert first.take(b'{"who": "first"}')
    try:
        assert not first.lost
        assert not second.take(b'{"who": "second"}')
        held = second.holder()
        assert held is not None and held.stamp == b'{"who": "first"}'
        assert held.dies_with_holder is (twin.kind == "local") and not held.endless
        assert twin.open().lease("flush-other").take(b"unrelated")  # another name, another lease
    finally:
        first.release()
    assert second.holder() is None  # released: it names nobody
    assert second.take(b'{"who": "second"}')
    second.release()


def test_two_takers_racing_for_a_free_lease_get_it_once(twin):
    leases = [twin.open().lease("flush-digits"), twin.open().lease("flush-digits")]
    taken = race(2, lambda i: leases[i].take(f"taker {i}".encode()))
    try:
        assert sorted(taken) == [False, True]
    finally:
        for lease in leases:
            lease.release()


def test_a_holder_stamp_reads_back_as_who_holds_it_and_since_when(twin):
    from core.storage.leases import holder_stamp

    lease = twin.open().lease("flush-digits")
    assert lease.take(holder_stamp())
    try:
        held = twin.open().lease("flush-digits").holder()
        assert held is not None
        holder = read_holder_stamp(held)
        assert holder.who == f"pid {os.getpid()} on {socket.gethostname()}" and holder.since is not None
    finally:
        lease.release()


def test_a_lease_taken_away_from_its_holder_is_reported_lost(twin, tmp_path):
    store = twin.open()
    lease = store.lease("flush-digits")
    assert lease.take(b"me")
    if twin.kind == "local":
        lock = Path(lease.location)
        lock.unlink()  # another holder could now lock a new file of that name
        assert lease.lost
    else:
        assert twin.container is not None
        BlobLeaseClient(twin.container.get_blob_client(f"{PREFIX}/{LEASES}/flush-digits")).break_lease(
            lease_break_period=0
        )
        renewal = lease.renewal
        renewal.thread.join(RESULT_TIMEOUT_S)  # the renewal ends at its first failure: wait for that
        assert lease.lost
    lease.release()
    next_holder = twin.open().lease("flush-digits")
    assert next_holder.take(b"next")
    next_holder.release()


# -- the registry, and Azure's errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("/var/retrain/ledger", "folder"),
        ("relative/ledger", "folder"),
        ("file:///var/retrain/ledger", "folder"),
        ("https://acct.blob.core.windows.net/ledger/prefix", "url"),
        ("http://127.0.0.1:10000/devstoreaccount1/ledger", "url"),
    ],
)
def test_a_location_picks_its_twin_by_scheme(spec, kind):
    location = parse_location(spec, "--store", InputError)
    assert (location.folder is not None, location.url is not None) == (kind == "folder", kind == "url")


@pytest.mark.parametrize(("spec", "message"), [("", "--store is empty"), ("s3://b/x", "scheme 's3'")])
def test_a_location_of_no_twin_is_refused_in_one_line(spec, message):
    with pytest.raises(InputError, match=message) as refused:
        parse_location(spec, "--store", InputError)
    assert "expected a local folder path or https://" in str(refused.value)


def test_a_missing_container_is_one_line_naming_the_store(azurite):
    spec = f"{azurite.container_url('never-created')}/{PREFIX}"
    store = open_record_store(
        spec, OWNER, InputError, {CONNECTION_STRING_VARIABLE: azurite.connection_string}
    )
    for action in (
        lambda: store.read("k.json"),
        lambda: store.create("k.json", b"x"),
        lambda: list(store.list("")),
        lambda: store.lease("flush").take(b"x"),
    ):
        with pytest.raises(
            InputError, match=f"never-created/{PREFIX}/ does not exist; create it first"
        ) as raised:
            action()
        assert "\n" not in str(raised.value) and azurite.account_key not in str(raised.value)


def test_a_transient_failure_keeps_its_azure_type_for_its_caller_to_retry(azurite):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dead = azurite.connection_string.replace(
        azurite.blob_endpoint, f"http://127.0.0.1:{port}/{azurite.account}"
    )
    store = BlobRecords(
        ContainerClient.from_connection_string(dead, "records", retry_total=0), OWNER, InputError
    )
    with pytest.raises(ServiceRequestError) as raised:
        store.read("k.json")
    assert is_transient(raised.value)


def test_the_retry_rule_and_the_wording_of_a_failure():
    throttled, forbidden = HttpResponseError(message="slow down"), HttpResponseError(message="no")
    throttled.status_code, throttled.reason = 429, "Too Many Requests"
    forbidden.status_code, forbidden.reason = 403, "Forbidden"
    forbidden.error_code = "AuthenticationFailed"
    assert is_transient(throttled) and not is_transient(forbidden)
    assert describe(forbidden) == "HTTP 403 Forbidden (AuthenticationFailed)"
    missing = ResourceNotFoundError(message="gone")
    missing.error_code = "ContainerNotFound"
    assert is_container_missing(missing) and not is_container_missing(forbidden)
    assert describe(ValueError("AccountKey=c2VjcmV0")) == "ValueError"  # never a foreign error's text
