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

An HTTP request's Idempotency-Key is the front door's, not a model's: before its claim, the key's
record (`keys/<id>.json`, created if absent) binds it to one model and one body, so the same key for
another model or body is refused however the requests race.

Layout: `claims/<model>/<id>.json`, `deliveries/<id>.json` (rejections), `keys/<id>.json` (Idempotency-Keys),
`submissions/<id>.json`, `models/<model>.json`, `leases/`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from function_app.ledger.records import (
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
    submission_replaceable,
)
from function_app.ledger.store import Hold, RecordStore
from function_app.policy.state import ModelState
from training.common import mask_secrets

CLAIMS, DELIVERIES, SUBMISSIONS, MODELS = "claims", "deliveries", "submissions", "models"
KEYS = "keys"
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

    def claim_of(self, model_name: str, record_id: str) -> Claim | None:
        name = self._claim_name(model_name, record_id)
        stored = self.store.read(name)
        if stored is None:
            return None
        return Claim(self._parse(name, stored.data, EventRecord.from_dict), stored.version, stored.tag)

    def event(self, record_id: str, model_names: Iterable[str]) -> EventRecord | None:
        """The event recorded under `record_id`: a claim of one of `model_names`, or a delivery."""
        check_record_id(record_id, "event record id")
        for model_name in model_names:
            claim = self.claim_of(model_name, record_id)
            if claim is not None:
                return claim.record
        name = f"{DELIVERIES}/{record_id}.json"
        stored = self.store.read(name)
        return None if stored is None else self._parse(name, stored.data, EventRecord.from_dict)

    def key_owner(self, record_id: str, model_name: str, fingerprint: str) -> KeyOwner:
        """What an Idempotency-Key (by its claim id) was first used for: this request's model and body
        fingerprint when it is the first (created if absent: of two racing requests one wins), else the
        earlier request's."""
        name = f"{KEYS}/{check_record_id(record_id, 'idempotency key id')}.json"
        owner = KeyOwner(model_name, fingerprint)
        if self.store.create(name, encode({"model_name": model_name, "fingerprint": fingerprint})):
            return owner
        stored = self.store.read(name)
        if stored is None:
            raise LedgerBusyError(f"ledger record {name} vanished while being read; retry")
        return self._parse(name, stored.data, KeyOwner.from_dict)

    def claims(self, model_name: str, tag: str = PENDING) -> list[Claim]:
        """The model's claims with `tag` (PENDING: the batch waiting for a flush), oldest first."""
        listed = [entry for entry in self.store.list(f"{CLAIMS}/{model_name}/") if entry.tag == tag]
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
        stored = self.store.read(name)
        if stored is None:
            return ModelState.empty(model_name), None
        state = self._parse(name, stored.data, lambda data: ModelState.from_dict(data["state"]))
        check_model(model_name, state)
        return state, stored.version

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

    def snapshot(self) -> dict[str, Any]:
        """`{"events": [...], "submissions": [...]}`, oldest first; each entry is its record's to_dict."""
        events = [
            self._parse(entry.name, self._read(entry.name), EventRecord.from_dict)
            for area in (CLAIMS, DELIVERIES)
            for entry in self.store.list(f"{area}/")
        ]
        submissions = [
            self._parse(entry.name, self._read(entry.name), SubmissionRecord.from_dict)
            for entry in self.store.list(f"{SUBMISSIONS}/")
        ]
        return build_snapshot(events, submissions)

    # -- helpers --------------------------------------------------------------------------------------

    def _submission(self, submission_id: str) -> tuple[SubmissionRecord, str] | None:
        name = self._submission_name(submission_id)
        stored = self.store.read(name)
        if stored is None:
            return None
        return self._parse(name, stored.data, SubmissionRecord.from_dict), stored.version

    def _read(self, name: str) -> bytes:
        stored = self.store.read(name)
        if stored is None:
            raise LedgerBusyError(f"ledger record {name} vanished while being read; retry")
        return stored.data

    def _parse(self, name: str, data: bytes, parse: Callable[[Any], _Record]) -> _Record:
        return parse_record(f"{self.location.rstrip('/')}/{name}", data, parse)

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


def _json(record: Any) -> bytes:
    return encode(record.to_dict())


def _record_id(name: str) -> str:
    return name.rsplit("/", 1)[-1].removesuffix(".json")


def open_ledger(spec: str, connection_string: str | None = None) -> Ledger:
    """The ledger `spec` names: a local folder, or a container (and prefix) URL in Blob Storage
    (https://<account>.blob.core.windows.net/<container>/<prefix>, with the managed identity; or the
    emulator's http://127.0.0.1:<port>/<account>/<container>/<prefix>, with `connection_string`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise LedgerError("ledger location is empty; expected a folder or an https blob container URL")
    spec = spec.strip()
    scheme = spec.split("://", 1)[0].lower() if "://" in spec else ""
    if scheme in ("http", "https"):
        from function_app.ledger.blob import open_blob_store  # the Blob SDK, only when the ledger is there

        return Ledger(open_blob_store(spec, connection_string))
    if scheme:
        raise LedgerError(
            f"ledger location {mask_secrets(spec.split('?', 1)[0])!r}: scheme {scheme!r} is not supported; "
            "expected a folder or an https blob container URL"
        )
    from function_app.ledger.local import LocalRecordStore

    return Ledger(LocalRecordStore(Path(spec).expanduser()))
