"""The ledger: every event and its decision, every submission and the data it pins, and each model's
policy state, on a record store (function_app/ledger/store.py: a local folder or Blob Storage).

Its cost per event does not depend on how much is pending: an arriving event costs one conditional write,
its claim (`claims/<model>/<claim id>.json`, created if absent under its dedupe key's id), which carries
its decision and the item it adds to the batch. Of two racing deliveries one claim wins; the other is a
duplicate. Nothing every event must win is written: the model's state (`models/<model>.json`) is only
read by events, and written by flushes.

A claim's tag says where its item is: '' while it is pending, the submission's id once a flush took it. A
flush lists the model's claims (names and tags only), reads the pending ones, and assembles the batch.
Flushing is single-writer per model: it runs under `flush_lease(model)` (a file lock locally, a blob lease
in Azure), so a batch is never taken twice, and a crashed flush is recovered once, by the next holder.

A record that cannot be read (truncated, empty, not the ledger's JSON, a stray file among the claims) costs
that record, never its model: whoever meets it moves it aside to `quarantine/` (the record store's move,
safe when two readers move it at once) with a warning naming it, and goes on with the rest; `snapshot`
lists what is there. A damaged model state is rebuilt from the model's submissions (the claims are its
pending items) and saved in its place.

A delivery whose claim lost is a duplicate, and costs one more conditional write,
`duplicates/<model>/<e-id>.json`, created if absent under its own event id's hash and naming the claim it
duplicates: a second write event for the same blob version, an HTTP retry, or the claim's own event
redelivered. The front door does not read the claim to tell the last from the others (a read costs a
storage round trip, as the write does); the snapshot leaves out a duplicate record of its claim's own event,
since the claim is that event's record. So every event id has one record, a redelivery writes nothing new
after its first, and a first arrival still costs its one write.

An HTTP request's Idempotency-Key is the front door's, not a model's: before its claim, the key's
record (`keys/<id>.json`, created if absent) binds it to one model and one body, so the same key for
another model or body is refused however the requests race.

Layout: `claims/<model>/<id>.json`, `duplicates/<model>/<id>.json`, `deliveries/<id>.json` (rejections),
`keys/<id>.json` (Idempotency-Keys), `submissions/<id>.json`, `models/<model>.json`, `leases/`,
`quarantine/<name>.<version>`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from core.storage.leases import Holder
from core.storage.records import UNREADABLE, Listed, Stored
from function_app.ledger.records import (
    DamagedRecord,
    DuplicateRecord,
    EventRecord,
    LedgerBusyError,
    LedgerError,
    SubmissionRecord,
    build_snapshot,
    check_claim,
    check_model,
    check_record_id,
    encode,
    parse_record,
    rebuild_state,
    submission_replaceable,
)
from function_app.ledger.store import QUARANTINE, Hold, RecordStore, open_ledger_store
from function_app.policy.state import ModelState

log = logging.getLogger(__name__)

CLAIMS, DELIVERIES, SUBMISSIONS, MODELS = "claims", "deliveries", "submissions", "models"
KEYS, DUPLICATES = "keys", "duplicates"
_CLAIM_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.json")  # a claim's name in its model's folder
PENDING = ""  # a pending claim's tag
MAX_UPDATE_ATTEMPTS = 16  # compare-and-set rounds on one submission before giving up as busy (transient)
_IO_THREADS = 16  # a flush reads and retags its batch's claims in parallel: round trips, not CPU
_Record = TypeVar("_Record")


@dataclass(frozen=True)
class Claim:
    """A claim as stored: the record, the version a retag must match, and its tag."""

    record: EventRecord
    version: str
    tag: str

    @property
    def pending(self) -> bool:
        return self.tag == PENDING


@dataclass(frozen=True)
class KeyOwner:
    """The request an Idempotency-Key belongs to: its model and its body's fingerprint."""

    model_name: str
    fingerprint: str

    @classmethod
    def from_dict(cls, data: Any) -> KeyOwner:
        model_name, fingerprint = data["model_name"], data["fingerprint"]
        if not isinstance(model_name, str) or not isinstance(fingerprint, str):
            raise TypeError("model_name and fingerprint must be text")
        return cls(model_name, fingerprint)


class Ledger:
    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self.location = store.location

    # -- events ---------------------------------------------------------------------------------------

    def claim(self, record: EventRecord) -> bool:
        """Create the event's claim if none has its id (its dedupe key's); False: a duplicate."""
        check_claim(record)
        if record.item is None or record.model_name is None:
            raise LedgerError(f"claim {record.id}: expected a model and a pending item")
        return self.store.create(self._claim_name(record.model_name, record.id), _json(record), PENDING)

    def record_delivery(self, record: EventRecord) -> None:
        """Record one delivery that claims nothing (a rejection) under its own fresh id."""
        if not self.store.create(
            f"{DELIVERIES}/{check_record_id(record.id, 'delivery id')}.json", _json(record)
        ):
            raise LedgerError(f"event record {record.id} exists; expected a fresh id from new_delivery_id()")

    def record_duplicate(self, record: DuplicateRecord) -> bool:
        """Record a delivery that duplicates a claim, created if absent under its own event id's record id:
        False when that event was recorded before (a redelivery of the duplicate), which writes nothing."""
        name = f"{DUPLICATES}/{record.model_name}/{check_record_id(record.id, 'duplicate id')}.json"
        return self.store.create(name, _json(record))

    def claim_of(self, model_name: str, record_id: str) -> Claim | None:
        """The claim of `record_id`; None if there is none, or it could not be read (moved aside)."""
        name = self._claim_name(model_name, record_id)
        stored = self.store.read(name)
        if stored is None:
            return None
        record = self._readable(name, stored, EventRecord.from_dict)
        return None if record is None else Claim(record, stored.version, stored.tag)

    def event(self, record_id: str, model_names: Iterable[str]) -> EventRecord | None:
        """The event recorded under `record_id`: a claim of one of `model_names`, or a delivery."""
        check_record_id(record_id, "event record id")
        for model_name in model_names:
            claim = self.claim_of(model_name, record_id)
            if claim is not None:
                return claim.record
        name = f"{DELIVERIES}/{record_id}.json"
        stored = self.store.read(name)
        return None if stored is None else self._readable(name, stored, EventRecord.from_dict)

    def key_owner(self, record_id: str, model_name: str, fingerprint: str) -> KeyOwner:
        """What an Idempotency-Key (by its claim id) was first used for: this request's model and body
        fingerprint when it is the first (created if absent: of two racing requests one wins), else the
        earlier request's."""
        name = f"{KEYS}/{check_record_id(record_id, 'idempotency key id')}.json"
        owner = KeyOwner(model_name, fingerprint)
        for _ in range(2):  # a damaged key record is moved aside once; this request then owns the key
            if self.store.create(name, encode({"model_name": model_name, "fingerprint": fingerprint})):
                return owner
            stored = self.store.read(name)
            if stored is None:
                break
            found = self._readable(name, stored, KeyOwner.from_dict)
            if found is not None:
                return found
        raise LedgerBusyError(f"ledger record {name} vanished while being read; retry")

    def claims(self, model_name: str, tag: str = PENDING) -> list[Claim]:
        """The model's claims with `tag` (PENDING: the batch waiting for a flush), oldest first."""
        folder = f"{CLAIMS}/{model_name}/"
        listed = []
        for entry in self.store.list(folder):
            if entry.tag == UNREADABLE or not _CLAIM_FILE.fullmatch(entry.name.removeprefix(folder)):
                self._quarantine(entry.name, entry.version, "not a claim of this model")
            elif entry.tag == tag:
                listed.append(entry)
        found = self._parallel(lambda entry: self.claim_of(model_name, _record_id(entry.name)), listed)
        claims = [claim for claim in found if claim is not None and claim.tag == tag]
        return sorted(claims, key=lambda claim: (claim.record.received_at, claim.record.id))

    def retag(self, claims: Iterable[Claim], make: Callable[[EventRecord], EventRecord], tag: str) -> None:
        """Rewrite each claim as `make(record)` with `tag`, if it is still the version read. Only the flush
        lease's holder retags, so a lost race means the lease was lost: stop."""

        def one(claim: Claim) -> None:
            name = self._claim_name(claim.record.model_name or "", claim.record.id)
            if not self.store.replace(name, _json(make(claim.record)), claim.version, tag):
                raise LedgerBusyError(f"claim {claim.record.id} changed under the flush; is the lease lost?")

        self._parallel(one, list(claims))

    # -- a model's state ------------------------------------------------------------------------------

    def load_state(self, model_name: str) -> tuple[ModelState, str | None]:
        """The model's state and its version; (an empty state, None) if it has never been saved."""
        name = f"{MODELS}/{model_name}.json"
        for _ in range(MAX_UPDATE_ATTEMPTS):
            stored = self.store.read(name)
            if stored is None:
                return ModelState.empty(model_name), None
            state = self._readable(name, stored, lambda data: _state_of(model_name, data))
            if state is not None:
                return state, stored.version
            # Moved aside: rebuilt from the submissions it summarises, and saved in its place. A reader
            # racing to do the same may win the create: its state is then read.
            state = self._rebuilt_state(model_name)
            if self.save_state(model_name, state, None):
                log.warning("model %s: its state was rebuilt from its submissions", model_name)
        raise LedgerBusyError(f"model {model_name!r}: its state kept changing while it was rebuilt; retry")

    def save_state(self, model_name: str, state: ModelState, version: str | None) -> bool:
        """Save `state` if the stored one is still `version` (None: none is stored). The pending and
        in-flight items are not part of it: they are the claims."""
        check_model(model_name, state)
        payload = encode({"state": replace(state, pending=(), in_flight_items=()).to_dict()})
        name = f"{MODELS}/{model_name}.json"
        return (
            self.store.create(name, payload)
            if version is None
            else self.store.replace(name, payload, version)
        )

    def flush_lease(self, model_name: str) -> AbstractContextManager[Hold | None]:
        """Enter to take the model's flush lease without waiting: None when another flush holds it."""
        return self.store.hold(f"flush-{model_name}")

    def flush_holder(self, model_name: str) -> Holder | None:
        """Who holds the model's flush lease and since when (None: nobody, now); for a refused flush to
        report, so a lease that never frees is seen, with what to break."""
        return self.store.holder(f"flush-{model_name}")

    # -- submissions ----------------------------------------------------------------------------------

    def create_submission(self, record: SubmissionRecord) -> bool:
        return self.store.create(self._submission_name(record.id), _json(record))

    def submission(self, submission_id: str) -> SubmissionRecord | None:
        found = self._submission(submission_id)
        return None if found is None else found[0]

    def update_submission(self, record: SubmissionRecord) -> bool:
        """Replace the submission of the same id (it must exist); False, keeping the stored one, when that
        one has finished with another status: a finished job never comes back to life."""
        for _ in range(MAX_UPDATE_ATTEMPTS):
            found = self._submission(record.id)
            if found is None:
                raise LedgerError(f"submission {record.id} does not exist; expected one created before")
            if not submission_replaceable(found[0], record):
                return False
            if self.store.replace(self._submission_name(record.id), _json(record), found[1]):
                return True
        raise LedgerBusyError(f"submission {record.id} changed under {MAX_UPDATE_ATTEMPTS} updates; retry")

    def raw_versions_in_use(self) -> dict[str, dict[str, str]]:
        """model -> {raw version: why} for the pinned data the front door still needs (`retrain gc` keeps
        it): every unfinished submission's, and each model's last finished one that pinned data, whose files
        the next batch is built on (rebuild_state's `last`)."""
        in_use: dict[str, dict[str, str]] = {}
        last: dict[str, tuple[str, str]] = {}  # model -> (raw version, id) of its newest finished submission
        records = self._records(f"{SUBMISSIONS}/", SubmissionRecord.from_dict)
        for record in sorted(records, key=lambda record: (record.updated_at, record.id)):
            if record.raw_version is None:
                continue
            if record.finished:
                last[record.model_name] = (record.raw_version, record.id)
            else:
                why = f"submission {record.id} is {record.status}"
                in_use.setdefault(record.model_name, {})[record.raw_version] = why
        for model_name, (version, submission_id) in last.items():
            why = f"submission {submission_id}, the last finished, is the next batch's basis"
            in_use.setdefault(model_name, {}).setdefault(version, why)
        return in_use

    def snapshot(self) -> dict[str, Any]:
        """`{"events": [...], "duplicates": [...], "submissions": [...], "quarantined": [...]}`: events,
        duplicates and submissions oldest first, each its record's to_dict; the names of the records moved
        aside, this time or before."""
        events = [
            event
            for area in (CLAIMS, DELIVERIES)
            for event in self._records(f"{area}/", EventRecord.from_dict)
        ]
        duplicates = self._records(f"{DUPLICATES}/", DuplicateRecord.from_dict)
        submissions = self._records(f"{SUBMISSIONS}/", SubmissionRecord.from_dict)
        quarantined = [entry.name for entry in self.store.list(f"{QUARANTINE}/")]
        return build_snapshot(events, submissions, quarantined, duplicates)

    # -- helpers --------------------------------------------------------------------------------------

    def _submission(self, submission_id: str) -> tuple[SubmissionRecord, str] | None:
        name = self._submission_name(submission_id)
        stored = self.store.read(name)
        if stored is None:
            return None
        record = self._readable(name, stored, SubmissionRecord.from_dict)
        return None if record is None else (record, stored.version)

    def _records(self, prefix: str, parse: Callable[[Any], _Record]) -> list[_Record]:
        """Every readable record under `prefix` (one that went meanwhile, or was moved aside, is left out)."""

        def one(entry: Listed) -> _Record | None:
            if entry.tag == UNREADABLE:
                self._quarantine(entry.name, entry.version, "not a ledger record")
                return None
            stored = self.store.read(entry.name)
            return None if stored is None else self._readable(entry.name, stored, parse)

        return [record for record in self._parallel(one, list(self.store.list(prefix))) if record is not None]

    def _rebuilt_state(self, model_name: str) -> ModelState:
        return rebuild_state(model_name, self._records(f"{SUBMISSIONS}/", SubmissionRecord.from_dict))

    def _readable(self, name: str, stored: Stored, parse: Callable[[Any], _Record]) -> _Record | None:
        """The record parsed; None when it cannot be, after moving it aside."""
        try:
            if stored.tag == UNREADABLE:
                raise DamagedRecord(self._display(name), "not a ledger record")
            return parse_record(self._display(name), stored.data, parse)
        except DamagedRecord as damaged:
            self._quarantine(name, stored.version, damaged.reason)
            return None

    def _quarantine(self, name: str, version: str, reason: str) -> None:
        moved = self.store.quarantine(name, version)
        if moved is not None:
            log.warning(
                "ledger record %s is unreadable (%s); moved aside to %s",
                self._display(name),
                reason,
                self._display(moved),
            )

    def _display(self, name: str) -> str:
        return f"{self.location.rstrip('/')}/{name}"

    @staticmethod
    def _claim_name(model_name: str, record_id: str) -> str:
        return f"{CLAIMS}/{model_name}/{check_record_id(record_id, 'claim id')}.json"

    @staticmethod
    def _submission_name(submission_id: str) -> str:
        return f"{SUBMISSIONS}/{check_record_id(submission_id, 'submission id')}.json"

    @staticmethod
    def _parallel(work: Callable[[Any], _Record], items: list[Any]) -> list[_Record]:
        if len(items) < 2:
            return [work(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(_IO_THREADS, len(items))) as pool:
            return list(pool.map(work, items))


def _state_of(model_name: str, data: Any) -> ModelState:
    state = ModelState.from_dict(data["state"])
    check_model(model_name, state)  # another model's state in this one's place is damage too
    return state


def _json(record: Any) -> bytes:
    return encode(record.to_dict())


def _record_id(name: str) -> str:
    return name.rsplit("/", 1)[-1].removesuffix(".json")


def open_ledger(spec: str, connection_string: str | None = None) -> Ledger:
    """The ledger `spec` names: a local folder, or a container (and prefix) URL in Blob Storage
    (https://<account>.blob.core.windows.net/<container>/<prefix>, with the managed identity; or the
    emulator's http://127.0.0.1:<port>/<account>/<container>/<prefix>, with `connection_string`)."""
    return Ledger(open_ledger_store(spec, connection_string))
