"""What the front door decides about: one typed trigger request per event, or a rejection with its reason.

Every trigger family (Blob-created, drift alert, HTTP) is parsed into a `TriggerRequest` by pure functions;
whatever does not belong becomes a `Rejection`, which is acknowledged and recorded, never retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

KIND_BLOB, KIND_DRIFT, KIND_HTTP = "blob", "drift", "http"
KINDS = (KIND_BLOB, KIND_DRIFT, KIND_HTTP)

# What the ledger records for every event and submission (the README's words).
ACCEPTED = "accepted"  # a new drift alert or HTTP request, to be submitted at the next flush
DUPLICATE = "duplicate"  # seen before (same dedupe key): nothing changes
DEBOUNCED = "debounced"  # a new blob added to the pending batch, which waits for a quiet period
COALESCED = "coalesced"  # arrived while a run is in flight: carried into the next run
REJECTED = "rejected"  # does not belong (wrong type, foreign container, malformed ...): acknowledged
COOLDOWN = "cooldown"  # refused for now by the cooldown or the daily budget; retried or coalesced later
SUBMITTED = "submitted"  # this event started a submission
DECISIONS = (ACCEPTED, DUPLICATE, DEBOUNCED, COALESCED, REJECTED, COOLDOWN, SUBMITTED)


@dataclass(frozen=True)
class BlobRef:
    """A committed blob as its Blob-created event describes it; the handler never reads the blob itself."""

    url: str
    account: str
    container: str
    name: str
    etag: str
    sequencer: str
    size: int

    @property
    def identity(self) -> str:
        """One version of one blob: its URL and eTag. Event Grid may deliver it several times."""
        return f"{self.url}#{self.etag}"


@dataclass(frozen=True)
class TriggerRequest:
    kind: str
    event_id: str
    dedupe_key: str
    model_name: str
    received_at: datetime
    blob: BlobRef | None = None
    reason: str | None = None
    force: bool = False
    data_uri: str | None = None


@dataclass(frozen=True)
class Rejection:
    kind: str
    event_id: str | None
    reason: str
