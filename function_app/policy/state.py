"""The policy's values: its settings, the items waiting for a run, and a model's state
(function_app/policy/rules.py has the rules). All are frozen and validated at construction; the state
round-trips through JSON for the ledger, which stores it under compare-and-set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime
from typing import Any

from core.errors import RetrainError
from core.names import check_model_name
from core.versions import is_version
from function_app.events.triggers import KIND_BLOB, KINDS, TriggerRequest

STATE_SCHEMA = 1
_SUBMISSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class PolicyError(RetrainError, ValueError):
    """A policy input is malformed; the message names it and the expected form. Still a ValueError, which
    the readers of stored state catch."""

    one_line = False  # kept as written


def aware(value: datetime, what: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise PolicyError(f"{what} {value!r}: expected a timezone-aware datetime (UTC)")
    return value.astimezone(UTC)


def time_text(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse_time(value: Any, what: str) -> datetime | None:
    if value is None:
        return None
    try:
        return aware(datetime.fromisoformat(value), what)
    except (TypeError, ValueError):
        raise PolicyError(f"{what} {value!r}: expected an ISO 8601 time with a UTC offset") from None


@dataclass(frozen=True)
class PolicySettings:
    """Debounce quiet period Q and maximum wait W, cooldown C (seconds), and daily budget B (runs)."""

    quiet_seconds: float
    max_wait_seconds: float
    cooldown_seconds: float
    max_runs_per_day: int

    def __post_init__(self) -> None:
        for name in ("quiet_seconds", "max_wait_seconds", "cooldown_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise PolicyError(f"{name} {value!r}: expected a finite number of seconds >= 0")
        if self.max_wait_seconds < self.quiet_seconds:
            raise PolicyError(
                f"max_wait_seconds {self.max_wait_seconds} is below quiet_seconds {self.quiet_seconds}: "
                "expected the maximum wait to be at least the quiet period"
            )
        runs = self.max_runs_per_day
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise PolicyError(f"max_runs_per_day {runs!r}: expected a whole number of runs >= 1")


@dataclass(frozen=True)
class PendingBlob:
    """One version of one blob: its URL and eTag, and Event Grid's sequencer to order versions of it."""

    url: str
    etag: str
    sequencer: str
    size: int = 0  # contentLength from the event: the data manifest records it

    def __post_init__(self) -> None:
        for name in ("url", "etag"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise PolicyError(f"pending blob {name} {getattr(self, name)!r}: expected a non-empty string")
        if not isinstance(self.sequencer, str):
            raise PolicyError(f"pending blob sequencer {self.sequencer!r}: expected a string")


@dataclass(frozen=True)
class PendingItem:
    """An accepted trigger waiting for (or riding in) a submission."""

    event_id: str
    dedupe_key: str
    kind: str
    arrived_at: datetime
    blob: PendingBlob | None = None
    force: bool = False
    reason: str | None = None
    data_uri: str | None = None

    def __post_init__(self) -> None:
        for name in ("event_id", "dedupe_key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise PolicyError(f"pending item {name} {getattr(self, name)!r}: expected a non-empty string")
        if self.kind not in KINDS:
            raise PolicyError(f"pending item kind {self.kind!r}: expected one of {list(KINDS)}")
        if (self.kind == KIND_BLOB) != (self.blob is not None):
            raise PolicyError(
                f"pending item {self.event_id!r} of kind {self.kind!r}: expected a blob exactly when the "
                "kind is 'blob'"
            )
        if not isinstance(self.force, bool):
            raise PolicyError(f"pending item force {self.force!r}: expected true or false")
        object.__setattr__(self, "arrived_at", aware(self.arrived_at, "pending item arrived_at"))

    @classmethod
    def from_request(cls, request: TriggerRequest, now: datetime) -> PendingItem:
        blob = request.blob
        return cls(
            event_id=request.event_id,
            dedupe_key=request.dedupe_key,
            kind=request.kind,
            arrived_at=now,
            blob=None if blob is None else PendingBlob(blob.url, blob.etag, blob.sequencer, blob.size),
            force=request.force,
            reason=request.reason,
            data_uri=request.data_uri,
        )

    def to_dict(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies every field, and a model's state holds hundreds of items.
        blob = self.blob
        return {
            "event_id": self.event_id,
            "dedupe_key": self.dedupe_key,
            "kind": self.kind,
            "arrived_at": self.arrived_at.isoformat(),
            "blob": None
            if blob is None
            else {"url": blob.url, "etag": blob.etag, "sequencer": blob.sequencer, "size": blob.size},
            "force": self.force,
            "reason": self.reason,
            "data_uri": self.data_uri,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PendingItem:
        try:
            values = {name: data[name] for name in _ITEM_FIELDS}
            blob, arrived_at = values.pop("blob"), values.pop("arrived_at")
            return cls(
                **values,
                arrived_at=_parse_time(arrived_at, "pending item arrived_at"),
                blob=None if blob is None else PendingBlob(**blob),
            )
        except (KeyError, TypeError) as err:
            raise PolicyError(
                f"pending item: missing or mistyped {err}; expected PendingItem.to_dict's form"
            ) from None


_ITEM_FIELDS = tuple(item_field.name for item_field in fields(PendingItem))
_STATE_TIMES = ("in_flight_since", "last_submission_at", "last_finished_at")
_STATE_ITEMS = ("pending", "in_flight_items")
_NEWER_FIELDS = ("in_flight_kind", "in_flight_raw_version")


def utc_day(moment: datetime) -> str:
    return moment.astimezone(UTC).date().isoformat()


@dataclass(frozen=True)
class ModelState:
    """What the policy remembers about one model; the ledger stores it and guards it with compare-and-set.

    `pending` waits for the next submission; `in_flight_items` ride in the submission `in_flight_id`
    (started at `in_flight_since`). `runs_today` counts the submissions started on the UTC day `runs_day`.
    """

    model_name: str
    pending: tuple[PendingItem, ...] = ()
    in_flight_id: str | None = None
    in_flight_since: datetime | None = None
    in_flight_items: tuple[PendingItem, ...] = ()
    # The in-flight batch's kind: what a recovery records when the flush that took it died before its
    # submission record existed.
    in_flight_kind: str | None = None
    # The in-flight batch's raw data version, which names its job (components.request.job_name_for): what
    # a recovery asks the submitter for when the submission's record cannot be read, so that a job still
    # running is followed, never started a second time.
    in_flight_raw_version: str | None = None
    last_submission_at: datetime | None = None
    runs_day: str | None = None
    runs_today: int = 0
    last_finished_id: str | None = None
    last_finished_at: datetime | None = None
    last_outcome: str | None = None

    def __post_init__(self) -> None:
        check_model_name(self.model_name, "model name", PolicyError)
        object.__setattr__(self, "pending", tuple(self.pending))
        object.__setattr__(self, "in_flight_items", tuple(self.in_flight_items))
        for name in ("in_flight_since", "last_submission_at", "last_finished_at"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, aware(getattr(self, name), f"model state {name}"))
        self._check_in_flight()
        keys = [item.dedupe_key for item in (*self.pending, *self.in_flight_items)]
        if len(set(keys)) != len(keys):
            raise PolicyError(
                f"model state of {self.model_name!r}: a dedupe key appears twice; expected each once"
            )
        if isinstance(self.runs_today, bool) or not isinstance(self.runs_today, int) or self.runs_today < 0:
            raise PolicyError(f"model state runs_today {self.runs_today!r}: expected a whole number >= 0")
        if self.runs_day is not None:
            try:
                date.fromisoformat(self.runs_day)
            except (TypeError, ValueError):
                raise PolicyError(
                    f"model state runs_day {self.runs_day!r}: expected a date YYYY-MM-DD"
                ) from None

    def _check_in_flight(self) -> None:
        if self.in_flight_id is None:
            if self.in_flight_since is not None or self.in_flight_items or self.in_flight_raw_version:
                raise PolicyError(
                    "model state: in-flight time, items or data version without an in-flight submission id"
                )
            return
        if self.in_flight_raw_version is not None and not is_version(self.in_flight_raw_version):
            raise PolicyError(
                f"model state in_flight_raw_version {self.in_flight_raw_version!r}: expected 'rd-<16 hex "
                "digits>'"
            )
        if not isinstance(self.in_flight_id, str) or not _SUBMISSION_ID.fullmatch(self.in_flight_id):
            raise PolicyError(
                f"submission id {self.in_flight_id!r}: expected 1-128 letters, digits, '.', '_' or '-'"
            )
        if self.in_flight_since is None:
            raise PolicyError(f"model state: submission {self.in_flight_id!r} in flight without a start time")
        if self.in_flight_kind is not None and self.in_flight_kind not in KINDS:
            raise PolicyError(
                f"model state in_flight_kind {self.in_flight_kind!r}: expected one of {list(KINDS)}"
            )

    @classmethod
    def empty(cls, model_name: str) -> ModelState:
        return cls(model_name=model_name)

    @property
    def first_pending_at(self) -> datetime | None:
        """The first pending arrival: the maximum wait W counts from here."""
        return min((item.arrived_at for item in self.pending), default=None)

    @property
    def last_arrival_at(self) -> datetime | None:
        """The last pending arrival: the quiet period Q counts from here."""
        return max((item.arrived_at for item in self.pending), default=None)

    def holds(self, dedupe_key: str) -> bool:
        """Whether an item with this dedupe key is pending or in flight."""
        return any(item.dedupe_key == dedupe_key for item in (*self.pending, *self.in_flight_items))

    def runs_on(self, now: datetime) -> int:
        """Submissions started on the UTC day of `now`."""
        return self.runs_today if self.runs_day == utc_day(now) else 0

    def to_dict(self) -> dict[str, Any]:
        values = {state_field.name: getattr(self, state_field.name) for state_field in fields(self)}
        values |= {name: [item.to_dict() for item in values[name]] for name in _STATE_ITEMS}
        values |= {name: time_text(values[name]) for name in _STATE_TIMES}
        return {"schema": STATE_SCHEMA, **values}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelState:
        if not isinstance(data, Mapping) or data.get("schema") != STATE_SCHEMA:
            found = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
            raise PolicyError(
                f"model state schema {found!r}: expected {STATE_SCHEMA}, as ModelState.to_dict writes"
            )
        try:
            # in_flight_kind and in_flight_raw_version are newer than the schema: a state saved before
            # them loads without them.
            values = {
                state_field.name: data[state_field.name]
                if state_field.name not in _NEWER_FIELDS
                else data.get(state_field.name)
                for state_field in fields(cls)
            }
            values |= {
                name: tuple(PendingItem.from_dict(item) for item in values[name]) for name in _STATE_ITEMS
            }
            values |= {name: _parse_time(values[name], f"model state {name}") for name in _STATE_TIMES}
            return cls(**values)
        except (KeyError, TypeError) as err:
            raise PolicyError(
                f"model state: missing or mistyped {err}; expected ModelState.to_dict's form"
            ) from None
