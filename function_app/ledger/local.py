"""The ledger: a durable record of every event and its decision, every submission and the data it pins, and
each model's policy state, in Blob Storage (function_app/ledger/blob.py) or a local folder (here).

Its conditional writes are what make racing Function instances agree:
- an event is claimed by creating its record if absent (keyed by its dedupe key): one claim wins, the
  others learn the event is a duplicate;
- a submission is created if absent (keyed by its id);
- a model's state is replaced only if it is still the version that was read (compare-and-set), so of two
  instances flushing the same batch, one saves `start_submission`'s state and submits, the other reloads.
Records are replaced whole and atomically: a reader sees the old record or the new one, never half of one.
Transient storage failures raise, so that Event Grid retries the event; nothing is swallowed.

How the service uses it, for one event: claim it (`EventRecord.claim`, not yet applied); False means seen
before, and only a record that still `needs_apply` (its claimer stopped before saving the state) is applied
again. Then load the state, `on_arrival`, save with the token (on False: reload and reapply), and record the
decision (`with_decision`, which marks it applied). A flush saves `start_submission`'s state first, then
creates the submission and marks its events submitted; an event that names a submission keeps it.

Layout, under the folder or the container prefix: `events/<id>.json`, `submissions/<id>.json`,
`models/<model>.json`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from function_app.ledger.records import (
    EVENTS,
    MODELS,
    SUBMISSION_STATUSES,
    SUBMISSIONS,
    SUBMITTING,
    EventRecord,
    InputPin,
    LedgerBusyError,
    LedgerError,
    SubmissionRecord,
    build_snapshot,
    check_claim,
    check_model,
    check_record_id,
    encode,
    event_id_for_key,
    event_replaceable,
    new_delivery_id,
    parse_record,
    submission_replaceable,
    versioned_state,
)
from function_app.policy.state import ModelState
from training.common import create_atomically, mask_secrets, write_atomically

__all__ = [
    "SUBMISSION_STATUSES",
    "SUBMITTING",
    "EventRecord",
    "InputPin",
    "Ledger",
    "LedgerBusyError",
    "LedgerError",
    "LocalLedger",
    "SubmissionRecord",
    "event_id_for_key",
    "new_delivery_id",
    "open_ledger",
]
_Record = TypeVar("_Record")


class Ledger(Protocol):
    """What the service needs from a ledger; `LocalLedger` and `BlobLedger` keep the same guarantees."""

    location: str

    def claim_event(self, record: EventRecord) -> bool:
        """Create the event's record if none has its id (its dedupe key's); False: a duplicate."""
        ...

    def record_event(self, record: EventRecord) -> None:
        """Record one delivery (a rejection, a duplicate) under its own fresh id."""
        ...

    def event(self, record_id: str) -> EventRecord | None: ...

    def update_event(self, record: EventRecord) -> bool:
        """Replace the event of the same id (it must exist); False, keeping the stored one, when `record`
        would take it back: unlink it from its submission, or mark an applied event unapplied (a slower
        writer with an older view)."""
        ...

    def load_state(self, model_name: str) -> tuple[ModelState, str | None]:
        """The model's state and its version token; (an empty state, None) if it has never been saved."""
        ...

    def save_state(self, model_name: str, state: ModelState, token: str | None) -> bool:
        """Save `state` if the stored one is still version `token` (None: none is stored); False on a lost
        race: reload, reapply, retry."""
        ...

    def create_submission(self, record: SubmissionRecord) -> bool:
        """Create the submission's record if none has its id; False if one does."""
        ...

    def update_submission(self, record: SubmissionRecord) -> bool:
        """Replace the submission of the same id (it must exist); False, keeping the stored one, when that
        one has finished with another status: a finished job never comes back to life."""
        ...

    def submission(self, submission_id: str) -> SubmissionRecord | None: ...

    def snapshot(self) -> dict[str, Any]:
        """`{"events": [...], "submissions": [...]}`, oldest first; each entry is its record's to_dict."""
        ...


class LocalLedger:
    """The ledger in a local folder (Unix). Create-if-absent is link(2) of a complete temporary file, which
    fails if the name exists; updates are an atomic rename under an flock(2) lock, which serialises threads
    and processes alike; the state's token is a version number that each save increments."""

    def __init__(self, folder: Path) -> None:
        self._folder = Path(folder)
        try:
            for area in (EVENTS, SUBMISSIONS, MODELS, ".locks"):
                (self._folder / area).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise LedgerError(
                f"ledger folder {folder}: cannot create it ({err.strerror}); expected a writable folder"
            ) from None
        self.location = str(self._folder)

    def claim_event(self, record: EventRecord) -> bool:
        check_claim(record)
        return self._create(self._path(EVENTS, record.id), record.to_dict())

    def record_event(self, record: EventRecord) -> None:
        if not self._create(self._path(EVENTS, record.id), record.to_dict()):
            raise LedgerError(f"event record {record.id} exists; expected a fresh id from new_delivery_id()")

    def event(self, record_id: str) -> EventRecord | None:
        return self._read(EVENTS, record_id, EventRecord.from_dict)

    def update_event(self, record: EventRecord) -> bool:
        return self._update(EVENTS, record.id, record, EventRecord.from_dict, event_replaceable)

    def load_state(self, model_name: str) -> tuple[ModelState, str | None]:
        stored = self._read(MODELS, model_name, versioned_state)
        if stored is None:
            return ModelState.empty(model_name), None
        version, state = stored
        check_model(model_name, state)
        return state, str(version)

    def save_state(self, model_name: str, state: ModelState, token: str | None) -> bool:
        check_model(model_name, state)
        with self._lock(f"{MODELS}-{model_name}"):
            stored = self._read(MODELS, model_name, versioned_state)
            current = None if stored is None else str(stored[0])
            if current != token:
                return False
            version = 1 if stored is None else stored[0] + 1
            payload = encode({"version": version, "state": state.to_dict()})
            write_atomically(self._path(MODELS, model_name), payload, sync_folder=True)
        return True

    def create_submission(self, record: SubmissionRecord) -> bool:
        return self._create(self._path(SUBMISSIONS, record.id), record.to_dict())

    def update_submission(self, record: SubmissionRecord) -> bool:
        return self._update(
            SUBMISSIONS, record.id, record, SubmissionRecord.from_dict, submission_replaceable
        )

    def submission(self, submission_id: str) -> SubmissionRecord | None:
        return self._read(SUBMISSIONS, submission_id, SubmissionRecord.from_dict)

    def snapshot(self) -> dict[str, Any]:
        events = [self._parse(path, EventRecord.from_dict) for path in self._listing(EVENTS)]
        submissions = [self._parse(path, SubmissionRecord.from_dict) for path in self._listing(SUBMISSIONS)]
        return build_snapshot(events, submissions)

    def _path(self, area: str, record_id: str) -> Path:
        return self._folder / area / f"{check_record_id(record_id, f'{area} record id')}.json"

    def _listing(self, area: str) -> list[Path]:
        return sorted(path for path in (self._folder / area).glob("*.json") if not path.name.startswith("."))

    def _parse(self, path: Path, parse: Callable[[Any], _Record]) -> _Record:
        return parse_record(str(path), path.read_bytes(), parse)

    def _read(self, area: str, record_id: str, parse: Callable[[Any], _Record]) -> _Record | None:
        path = self._path(area, record_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return parse_record(str(path), data, parse)

    def _create(self, path: Path, payload: Mapping[str, Any]) -> bool:
        # Linked into place, never replaced: of two racing claims one wins; the folder is synced, so an
        # acknowledged claim survives a crash.
        return create_atomically(path, encode(payload), sync_folder=True)

    def _update(
        self,
        area: str,
        record_id: str,
        record: Any,
        parse: Callable[[Any], _Record],
        replaceable: Callable[[_Record, _Record], bool],
    ) -> bool:
        with self._lock(area):
            old = self._read(area, record_id, parse)
            if old is None:
                raise LedgerError(f"{area} record {record_id} does not exist; expected one created before")
            if not replaceable(old, record):
                return False
            write_atomically(self._path(area, record_id), encode(record.to_dict()), sync_folder=True)
        return True

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        descriptor = os.open(self._folder / ".locks" / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)  # released when the descriptor closes
            yield
        finally:
            os.close(descriptor)


def open_ledger(spec: str, connection_string: str | None = None) -> Ledger:
    """The ledger `spec` names: a local folder, or a container (and prefix) URL in Blob Storage
    (https://<account>.blob.core.windows.net/<container>/<prefix>, with the managed identity; or the
    emulator's http://127.0.0.1:<port>/<account>/<container>/<prefix>, with `connection_string`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise LedgerError("ledger location is empty; expected a folder or an https blob container URL")
    spec = spec.strip()
    scheme = spec.split("://", 1)[0].lower() if "://" in spec else ""
    if scheme in ("http", "https"):
        from function_app.ledger.blob import open_blob_ledger  # the Blob SDK, only when the ledger is there

        return open_blob_ledger(spec, connection_string)
    if scheme:
        raise LedgerError(
            f"ledger location {mask_secrets(spec.split('?', 1)[0])!r}: scheme {scheme!r} is not supported; "
            "expected a folder or an https blob container URL"
        )
    return LocalLedger(Path(spec).expanduser())
