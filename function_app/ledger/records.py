"""The ledger's records: events and their decisions, submissions and the inputs they pin, with the rules
for replacing them, and the JSON the ledger stores (function_app/ledger/ledger.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, TypeVar

from components.request import CANCELED, COMPLETED, FAILED, QUEUED, RUNNING, TERMINAL_STATES
from core.errors import RetrainError
from core.secrets import mask_secrets
from core.versions import is_version
from function_app.events.triggers import DECISIONS, KINDS, SUBMITTED, TriggerRequest
from function_app.policy.state import ModelState, PendingItem, PolicyError, utc_day

SUBMITTING = "Submitting"  # recorded before the submitter has accepted the job
SUBMISSION_STATUSES = (SUBMITTING, QUEUED, RUNNING, COMPLETED, FAILED, CANCELED)
_RECORD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_Record = TypeVar("_Record")


class LedgerError(RetrainError):
    """The ledger cannot be used as asked; the one-line, secret-free message says what to change."""

    one_line = False  # kept as written


class LedgerBusyError(LedgerError):
    """A record kept changing under a compare-and-set update; transient: retry the event."""


class DamagedRecord(LedgerError):
    """A stored record that cannot be read (truncated, empty, not the ledger's JSON): the ledger moves it
    aside rather than let it stop its model. `reason` is why, in a few words."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"ledger record {name} is unreadable ({reason}); expected the ledger's JSON")
        self.reason = reason


def event_id_for_key(dedupe_key: str) -> str:
    """The record id an event is claimed under: a hash, since dedupe keys hold URLs and other characters."""
    return "k-" + hashlib.sha256(dedupe_key.encode()).hexdigest()[:40]


def new_delivery_id() -> str:
    """A fresh record id for one delivery (a rejection, a duplicate): never claims, never collides."""
    return "d-" + uuid.uuid4().hex


def duplicate_id_for_event(event_id: str) -> str:
    """The record id a duplicate delivery is recorded under: its own event id, hashed (an Event Grid id may
    hold any printable character), so that a redelivery of that duplicate finds its record taken."""
    return "e-" + hashlib.sha256(event_id.encode()).hexdigest()[:40]


def check_record_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _RECORD_ID.fullmatch(value):
        raise LedgerError(f"{what} {value!r}: expected 1-128 letters, digits, '.', '_' or '-'")
    return value


def _aware(value: Any, what: str) -> datetime:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = datetime.fromisoformat(value)
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise LedgerError(f"{what} {value!r}: expected a timezone-aware time (ISO 8601 with an offset)")
    return value.astimezone(UTC)


def _details(value: Mapping[str, Any] | None, what: str) -> Mapping[str, Any]:
    try:
        return MappingProxyType(json.loads(json.dumps(dict(value or {}))))
    except (TypeError, ValueError):
        raise LedgerError(
            f"{what} details: expected a mapping of JSON values (text, numbers, lists)"
        ) from None


@dataclass(frozen=True)
class EventRecord:
    """One event and what was decided about it. `id` is `event_id_for_key(dedupe_key)` for a claimed event
    (see `claim`), or a `new_delivery_id()` for a delivery recorded as it is (see `delivery`).

    A claim carries its `item`, which waits for the next submission until a flush takes it (`submission`);
    an HTTP request's claim carries its body's `fingerprint`, so that a reused Idempotency-Key with another
    body is told apart from a retry."""

    id: str
    kind: str
    decision: str
    reason: str
    received_at: datetime
    model_name: str | None = None
    event_id: str | None = None
    dedupe_key: str | None = None
    submission: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    item: PendingItem | None = None
    fingerprint: str | None = None

    def __post_init__(self) -> None:
        check_record_id(self.id, "event record id")
        if self.item is not None and not isinstance(self.item, PendingItem):
            raise LedgerError(f"event {self.id} item: expected a PendingItem")
        if self.kind not in KINDS:
            raise LedgerError(f"event {self.id} kind {self.kind!r}: expected one of {list(KINDS)}")
        if self.decision not in DECISIONS:
            raise LedgerError(
                f"event {self.id} decision {self.decision!r}: expected one of {list(DECISIONS)}"
            )
        if not isinstance(self.reason, str):
            raise LedgerError(f"event {self.id} reason {self.reason!r}: expected text")
        if self.submission is not None:
            check_record_id(self.submission, f"event {self.id} submission id")
        elif self.decision == SUBMITTED:
            raise LedgerError(f"event {self.id} is 'submitted' without a submission id; expected one")
        if self.id.startswith("k-") and (
            self.dedupe_key is None or self.id != event_id_for_key(self.dedupe_key)
        ):
            raise LedgerError(
                f"event record id {self.id} is not the claim id of its dedupe key; build it with "
                "EventRecord.claim, or use a delivery id"
            )
        object.__setattr__(self, "received_at", _aware(self.received_at, f"event {self.id} received_at"))
        object.__setattr__(self, "details", _details(self.details, f"event {self.id}"))

    @classmethod
    def claim(
        cls,
        request: TriggerRequest,
        decision: str,
        reason: str,
        *,
        item: PendingItem,
        details: Mapping[str, Any] | None = None,
        fingerprint: str | None = None,
    ) -> EventRecord:
        """The record that claims `request`'s dedupe key, with the item it adds to the pending batch."""
        return cls(
            id=event_id_for_key(request.dedupe_key),
            kind=request.kind,
            decision=decision,
            reason=reason,
            received_at=request.received_at,
            model_name=request.model_name,
            event_id=request.event_id,
            dedupe_key=request.dedupe_key,
            details=details or {},
            item=item,
            fingerprint=fingerprint,
        )

    @classmethod
    def delivery(
        cls, kind: str, decision: str, reason: str, received_at: datetime, **fields: Any
    ) -> EventRecord:
        """A record of one delivery under a fresh id (for rejections and duplicates); `fields` are the
        optional ones (model_name, event_id, dedupe_key, details)."""
        return cls(new_delivery_id(), kind, decision, reason, received_at, **fields)

    def with_decision(self, decision: str, reason: str, submission: str | None = None) -> EventRecord:
        """This event taken into `submission` (or returned to the pending batch: None), and why."""
        return replace(self, decision=decision, reason=reason, submission=submission)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "decision": self.decision,
            "reason": self.reason,
            "submission": self.submission,
            "received_at": self.received_at.isoformat(),
            "model_name": self.model_name,
            "event_id": self.event_id,
            "dedupe_key": self.dedupe_key,
            "details": dict(self.details),
            "item": None if self.item is None else self.item.to_dict(),
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EventRecord:
        item = data["item"]
        values = {name: data[name] for name in _EVENT_FIELDS}
        return cls(**values, item=None if item is None else PendingItem.from_dict(item))


@dataclass(frozen=True)
class DuplicateRecord:
    """One delivery whose claim lost: an event that brings nothing new (a redelivery, a second write event
    for the same blob version, an HTTP retry) recorded beside the claim it duplicates, so that every event
    id the ledger was given has a record that says what became of it. `id` is
    `duplicate_id_for_event(event_id)` of the event as delivered; `event_id` is kept masked."""

    id: str
    event_id: str
    kind: str
    model_name: str
    received_at: datetime
    duplicate_of: str  # the claim's record id (k-...): its decision is this event's

    def __post_init__(self) -> None:
        check_record_id(self.id, "duplicate record id")
        if not self.id.startswith("e-"):
            raise LedgerError(f"duplicate record id {self.id}: expected duplicate_id_for_event(event id)")
        if not isinstance(self.event_id, str) or not self.event_id:
            raise LedgerError(f"duplicate {self.id} event id {self.event_id!r}: expected text")
        if self.kind not in KINDS:
            raise LedgerError(f"duplicate {self.id} kind {self.kind!r}: expected one of {list(KINDS)}")
        if not isinstance(self.model_name, str) or not self.model_name:
            raise LedgerError(f"duplicate {self.id} model {self.model_name!r}: expected a model name")
        if not check_record_id(self.duplicate_of, f"duplicate {self.id} claim id").startswith("k-"):
            raise LedgerError(f"duplicate {self.id} names {self.duplicate_of!r}; expected a claim id (k-...)")
        object.__setattr__(self, "received_at", _aware(self.received_at, f"duplicate {self.id} received_at"))

    @classmethod
    def of(
        cls, event_id: str, kind: str, model_name: str, received_at: datetime, claim_id: str
    ) -> DuplicateRecord:
        """The record of the delivery `event_id` that duplicates the claim `claim_id`."""
        return cls(
            duplicate_id_for_event(event_id), mask_secrets(event_id), kind, model_name, received_at, claim_id
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event_id": self.event_id,
            "kind": self.kind,
            "model_name": self.model_name,
            "received_at": self.received_at.isoformat(),
            "duplicate_of": self.duplicate_of,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DuplicateRecord:
        return cls(**{name: data[name] for name in _DUPLICATE_FIELDS})


_DUPLICATE_FIELDS = ("id", "event_id", "kind", "model_name", "received_at", "duplicate_of")

_EVENT_FIELDS = (
    *("id", "kind", "decision", "reason", "received_at"),
    *("model_name", "event_id", "dedupe_key", "submission", "details", "fingerprint"),
)


@dataclass(frozen=True)
class InputPin:
    """One input a submission pins: where it is, and its fingerprint ('etag:<etag>' or 'sha256:<hex>')."""

    url: str
    fingerprint: str

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise LedgerError(f"input url {self.url!r}: expected a blob URL or a file URI")
        if not isinstance(self.fingerprint, str) or not self.fingerprint.startswith(("etag:", "sha256:")):
            raise LedgerError(
                f"input {self.url} fingerprint {self.fingerprint!r}: expected 'etag:..' or 'sha256:..'"
            )

    @classmethod
    def of_manifest(cls, manifest: Any) -> tuple[InputPin, ...]:
        """The pins of a components.data_version.DataManifest: each file's source and fingerprint."""
        return tuple(cls(file.source, file.fingerprint) for file in manifest.files)


@dataclass(frozen=True)
class SubmissionRecord:
    """One submission: the batch's kind, the data it pins (`inputs`, hashed into `raw_version`, the raw data
    version 'rd-...'), the events that ride in it, and the job's status as the submitter last reported it."""

    id: str
    model_name: str
    kind: str
    status: str
    created_at: datetime
    updated_at: datetime
    raw_version: str | None = None
    inputs: tuple[InputPin, ...] = ()
    events: tuple[str, ...] = ()
    job_name: str | None = None
    backend: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    # What the run was expected to spend (components.cost.CostEstimate.to_dict()), recorded before the
    # submitter is called; None for a submission that never got that far, or one recorded before estimates.
    estimate: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        check_record_id(self.id, "submission id")
        if self.kind not in KINDS:
            raise LedgerError(f"submission {self.id} kind {self.kind!r}: expected one of {list(KINDS)}")
        if self.status not in SUBMISSION_STATUSES:
            raise LedgerError(
                f"submission {self.id} status {self.status!r}: expected one of {list(SUBMISSION_STATUSES)}"
            )
        if self.raw_version is not None and not is_version(self.raw_version):
            raise LedgerError(
                f"submission {self.id} raw version {self.raw_version!r}: expected 'rd-<16 hex digits>'"
            )
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if not all(isinstance(pin, InputPin) for pin in self.inputs):
            raise LedgerError(f"submission {self.id} inputs: expected InputPin(url, fingerprint) values")
        object.__setattr__(
            self, "events", tuple(check_record_id(e, "submission event id") for e in self.events)
        )
        for name in ("created_at", "updated_at"):
            object.__setattr__(self, name, _aware(getattr(self, name), f"submission {self.id} {name}"))
        object.__setattr__(self, "details", _details(self.details, f"submission {self.id}"))
        if self.estimate is not None:
            if not isinstance(self.estimate, Mapping) or not isinstance(self.estimate.get("summary"), str):
                raise LedgerError(
                    f"submission {self.id} estimate: expected a mapping with a 'summary' line "
                    "(components.cost.CostEstimate.to_dict())"
                )
            object.__setattr__(self, "estimate", _details(self.estimate, f"submission {self.id} estimate"))

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATES

    def with_status(self, status: str, now: datetime, **changes: Any) -> SubmissionRecord:
        """This record with a new status at `now`; `changes` may set job_name, backend, details,
        raw_version and inputs."""
        return replace(self, status=status, updated_at=now, **changes)

    def with_estimate(self, estimate: Mapping[str, Any], now: datetime) -> SubmissionRecord:
        """This record with what its run is expected to spend, at `now`."""
        return replace(self, estimate=estimate, updated_at=now)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "raw_version": self.raw_version,
            "inputs": [pin.url for pin in self.inputs],
            "status": self.status,
            "model_name": self.model_name,
            "job_name": self.job_name,
            "backend": self.backend,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "events": list(self.events),
            "pins": [{"url": pin.url, "fingerprint": pin.fingerprint} for pin in self.inputs],
            "details": dict(self.details),
            "estimate": None if self.estimate is None else dict(self.estimate),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SubmissionRecord:
        names = ("id", "model_name", "kind", "status", "created_at", "updated_at", "job_name", "backend")
        values = {name: data[name] for name in (*names, "details")}
        # Records written before the raw version had its own name keep it under "data_version".
        raw_version = data["raw_version"] if "raw_version" in data else data["data_version"]
        pins = tuple(InputPin(pin["url"], pin["fingerprint"]) for pin in data["pins"])
        # Records written before estimates existed have no "estimate" key: they load without one.
        estimate = data.get("estimate")
        return cls(
            **values, raw_version=raw_version, inputs=pins, events=tuple(data["events"]), estimate=estimate
        )


def check_claim(record: EventRecord) -> None:
    if record.dedupe_key is None or record.id != event_id_for_key(record.dedupe_key):
        raise LedgerError(f"event {record.id} is not a claim; expected EventRecord.claim(request, ...)")


def submission_replaceable(old: SubmissionRecord, new: SubmissionRecord) -> bool:
    """Whether `new` may replace `old`; raises if it rewrites what the submission is or pins."""
    for name in ("model_name", "kind", "created_at", "raw_version", "inputs", "estimate"):
        before = getattr(old, name)
        if before not in (None, ()) and before != getattr(new, name):
            why = "a submission's pins are fixed"
            if name == "estimate":
                why = "an estimate stays what was expected when the run was sent"
            raise LedgerError(f"submission {old.id}: an update changes its {name}; {why}")
    return not (old.finished and new.status != old.status)


def parse_record(name: str, data: bytes, parse: Callable[[Any], _Record]) -> _Record:
    """A stored record, or a one-line LedgerError naming it."""
    try:
        return parse(json.loads(data))
    except (ValueError, KeyError, TypeError, AttributeError, LedgerError, PolicyError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DamagedRecord(name, reason) from None


def encode(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode() + b"\n"  # compact: the C encoder


def build_snapshot(
    events: list[EventRecord],
    submissions: list[SubmissionRecord],
    quarantined: list[str],
    duplicates: list[DuplicateRecord] | None = None,
) -> dict[str, Any]:
    """The ledger as `retrain ledger` shows it. A duplicate record of its claim's own event (a redelivery:
    the front door records a lost claim's event without reading the claim) is left out: the claim is that
    event's record, so every event id has one."""
    claimed = {event.id: event.event_id for event in events}
    duplicates = [each for each in duplicates or [] if claimed.get(each.duplicate_of) != each.event_id]
    return {
        "events": [e.to_dict() for e in sorted(events, key=lambda e: (e.received_at, e.id))],
        "duplicates": [d.to_dict() for d in sorted(duplicates, key=lambda d: (d.received_at, d.id))],
        "submissions": [s.to_dict() for s in sorted(submissions, key=lambda s: (s.created_at, s.id))],
        "quarantined": sorted(quarantined),
    }


def rebuild_state(model_name: str, submissions: list[SubmissionRecord]) -> ModelState:
    """A model's state as its submissions have it, for one whose stored state was damaged: the newest
    unfinished submission in flight, the newest finished one (that pinned data, if any did) as the last,
    and every submission started on the newest one's UTC day counted in that day's budget (a refused one
    included: counting one too many can only delay a run, never overspend). Its pending items are the
    claims, which the state never holds."""
    ours = sorted((s for s in submissions if s.model_name == model_name), key=lambda s: (s.created_at, s.id))
    if not ours:
        return ModelState.empty(model_name)
    newest = ours[-1]
    day = utc_day(newest.created_at)
    in_flight = next((s for s in reversed(ours) if not s.finished), None)
    finished = [s for s in ours if s.finished]
    pinned = [s for s in finished if s.raw_version is not None]
    last = max(pinned or finished, key=lambda s: (s.updated_at, s.id)) if finished else None
    return ModelState(
        model_name=model_name,
        in_flight_id=in_flight.id if in_flight else None,
        in_flight_since=in_flight.created_at if in_flight else None,
        in_flight_kind=in_flight.kind if in_flight else None,
        in_flight_raw_version=in_flight.raw_version if in_flight else None,
        last_submission_at=newest.created_at,
        runs_day=day,
        runs_today=sum(1 for s in ours if utc_day(s.created_at) == day),
        last_finished_id=last.id if last else None,
        last_finished_at=last.updated_at if last else None,
        last_outcome=last.status if last else None,
    )


def check_model(model_name: str, state: ModelState) -> None:
    if state.model_name != model_name:
        raise LedgerError(
            f"state of model {state.model_name!r} given for {model_name!r}; expected the same model"
        )
