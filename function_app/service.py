"""The front door: parse -> claim -> (flush) -> submit. Every trigger handler delegates here.

Event Grid delivers at least once, several Function instances handle events at once, and a burst brings
thousands. An event costs one read (its model's small state, for the decision's word) and one conditional
write: its claim, created if absent under its dedupe key, which records the decision and the item it adds
to the batch. A claim that loses is a duplicate, and records itself beside the claim in one more
create-if-absent write, keyed by its own event id, so that every event id has a record; it does not read
the claim first (a redelivery of the claim's own event leaves one such note, which the ledger folds into
the claim), so a duplicate costs two conditional writes and no read. An HTTP retry reads the claim, since
its answer quotes the first request's decision. Nothing all events must win is written, so the cost of an
event does not grow with what is pending. Flushes (function_app/flush.py) assemble the batch from the
claims, one flush per model at a time. Permanent rejections are recorded and returned; transient failures
(storage, the submitter) raise, so Event Grid retries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from components.request import Submitter
from core.text import quoted
from function_app.events.http_retrain import (
    BAD_REQUEST,
    IDEMPOTENCY_KEY,
    HttpRejection,
    has_idempotency_key,
    parse_http_retrain,
)
from function_app.events.parsing import parse_blob_created, parse_drift_alert, parse_event
from function_app.events.triggers import (
    ACCEPTED,
    COALESCED,
    COOLDOWN,
    DEBOUNCED,
    DUPLICATE,
    KIND_BLOB,
    KIND_DRIFT,
    REJECTED,
    Rejection,
    TriggerRequest,
)
from function_app.flush import OUTCOME_KEYS, Flusher, SubmissionPlan
from function_app.ledger.ledger import Ledger
from function_app.ledger.records import (
    DuplicateRecord,
    EventRecord,
    LedgerError,
    SubmissionRecord,
    check_record_id,
    event_id_for_key,
)
from function_app.pinning import DataPinner
from function_app.policy.rules import (
    FlushVerdict,
    ModelState,
    PendingItem,
    PolicySettings,
    flush_verdict,
    on_arrival,
)
from function_app.settings.app import AppSettings
from function_app.task_check import TaskCheck

log = logging.getLogger(__name__)

UNPROCESSABLE = 422
_OTHER_BODY = (
    f"the {IDEMPOTENCY_KEY} was used before with another request body; expected the same body to repeat "
    "that request, or a new key for a new one"
)
STATE_FRESH = timedelta(seconds=2)  # how old a state may be that only words an Event Grid decision
_REASONS = {
    ACCEPTED: "accepted for the next run",
    DEBOUNCED: "joined the pending batch; it is submitted after the quiet period",
    COALESCED: "a run is in flight or cooling down; carried into the next run",
    COOLDOWN: "cooling down or over the day's budget; kept for the next run",
}


@dataclass(frozen=True)
class EventOutcome:
    record_id: str
    event_id: str | None
    kind: str
    decision: str
    reason: str
    submission: str | None = None
    subject: str | None = None  # what the event is about, for people: the blob's name
    earlier: EventRecord | None = None  # a duplicate's first delivery


@dataclass(frozen=True)
class HttpOutcome:
    status: int
    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


def utc_now() -> datetime:
    return datetime.now(UTC)


class FrontDoor:
    def __init__(
        self,
        settings: AppSettings,
        ledger: Ledger,
        submitter: Submitter,
        pinner: DataPinner,
        clock: Callable[[], datetime] = utc_now,
        on_step: Callable[[str], None] | None = None,
        task_check: TaskCheck | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self._clock = clock
        self._policy = PolicySettings(
            settings.debounce_quiet_seconds,
            settings.debounce_max_wait_seconds,
            settings.cooldown_seconds,
            settings.max_runs_per_day,
        )
        plan = SubmissionPlan(
            settings.pipeline_parameters, settings.processes_per_node, settings.nodes, settings.cost
        )
        self._states: dict[str, tuple[datetime, ModelState]] = {}  # model -> (read at, state)
        self._flusher = Flusher(ledger, submitter, pinner, clock, self._policy, plan, on_step, task_check)

    # -- events -------------------------------------------------------------------------------------------

    def deliver(self, payload: Mapping[str, Any], family: str | None = None) -> EventOutcome:
        """Decide about one Event Grid event (either schema); `family` is the trigger it reached."""
        now = self._clock()
        # Each trigger parses only its own family, so a misrouted event is rejected with the reason why.
        parse = {KIND_BLOB: parse_blob_created, KIND_DRIFT: parse_drift_alert}.get(family or "", parse_event)
        parsed = parse(payload, self.settings, now)
        if isinstance(parsed, Rejection):
            return self._reject(parsed, now)
        return self._admit(parsed, now)

    def _reject(self, rejection: Rejection, now: datetime) -> EventOutcome:
        record = EventRecord.delivery(
            rejection.kind, REJECTED, rejection.reason, now, event_id=rejection.event_id
        )
        self.ledger.record_delivery(record)
        # DEBUG: the trigger's handler logs the decision, naming the blob; a second line would repeat it.
        log.debug("rejected %s event %s: %s", rejection.kind, rejection.event_id, rejection.reason)
        return EventOutcome(record.id, rejection.event_id, rejection.kind, REJECTED, rejection.reason)

    def _admit(self, request: TriggerRequest, now: datetime, fingerprint: str | None = None) -> EventOutcome:
        state = self._state_for_words(request.model_name, now, fresh=fingerprint is not None)
        decision, _ = on_arrival(state, request, now, self._policy)
        reason = _REASONS[decision]
        item = PendingItem.from_request(request, now)
        claim = EventRecord.claim(request, decision, reason, item=item, fingerprint=fingerprint)
        subject = request.blob.name if request.blob is not None else None
        if self.ledger.claim(claim):
            return EventOutcome(claim.id, request.event_id, request.kind, decision, reason, subject=subject)
        # A duplicate, recorded beside the claim under its own event id. Not read first to tell the claim's
        # own event redelivered from another one: a read costs what a write does, and the ledger folds a
        # note of the claim's own event into the claim (every event id keeps one record).
        self.ledger.record_duplicate(
            DuplicateRecord.of(
                request.event_id, request.kind, request.model_name, request.received_at, claim.id
            )
        )
        if fingerprint is None:
            reason = f"duplicate of an event already claimed as {claim.id}"
            return EventOutcome(claim.id, request.event_id, request.kind, DUPLICATE, reason, subject=subject)
        # An HTTP retry is answered with the first request's decision (and refused for another body).
        earlier = self.ledger.claim_of(request.model_name, claim.id)
        what = f"{earlier.record.decision} as {claim.id}" if earlier else "claimed by another delivery"
        return EventOutcome(
            claim.id,
            request.event_id,
            request.kind,
            DUPLICATE,
            f"duplicate of an event already {what}",
            subject=subject,
            earlier=earlier.record if earlier else None,
        )

    def _state_for_words(self, model_name: str, now: datetime, fresh: bool) -> ModelState:
        """The model's state, for the word an event's decision is told in (debounced, coalesced ...): an
        event's claim does not depend on it, and the flush decides anew under its lease. So an Event Grid
        delivery may use a state read up to STATE_FRESH_S ago by this instance, which saves a storage round
        trip per event in a burst; an HTTP request, answered 409/429 by it, reads it fresh."""
        cached = self._states.get(model_name)
        if not fresh and cached is not None and timedelta(0) <= now - cached[0] < STATE_FRESH:
            return cached[1]
        state, _ = self.ledger.load_state(model_name)
        self._states[model_name] = (now, state)
        return state

    # -- HTTP ---------------------------------------------------------------------------------------------

    def retrain(self, body: bytes, headers: Mapping[str, str], url: str = "") -> HttpOutcome:
        """`POST /api/retrain`: 202 with the request's id and its status URL; 400/413 for a bad request; 409
        (cooling down) or 429 (over the day's budget) with Retry-After; 422 for an Idempotency-Key reused
        with another body. A retry with the same key and body gets the first answer again."""
        now = self._clock()
        parsed = parse_http_retrain(body, headers, self.settings, now)
        try:
            base = status_base(url)  # checked before anything is claimed: a 500 after the claim is no answer
        except ValueError as error:
            parsed = HttpRejection(BAD_REQUEST, str(error))
        if isinstance(parsed, HttpRejection):
            self.ledger.record_delivery(EventRecord.delivery("http", REJECTED, parsed.reason, now))
            return HttpOutcome(parsed.status, {"error": parsed.reason})
        fingerprint = request_fingerprint(body)
        if has_idempotency_key(parsed):
            # Bound to one model and one body before any claim is written: claims live in their model's
            # area, so only the key's own record sees a reuse for another model.
            owner = self.ledger.key_owner(event_id_for_key(parsed.dedupe_key), parsed.model_name, fingerprint)
            if owner.model_name != parsed.model_name:
                reason = (
                    f"the {IDEMPOTENCY_KEY} was used before for model {owner.model_name!r}; expected a new "
                    f"key for a request for {parsed.model_name!r}"
                )
                return HttpOutcome(UNPROCESSABLE, {"error": reason})
            if owner.fingerprint != fingerprint:
                return HttpOutcome(UNPROCESSABLE, {"error": _OTHER_BODY})
        outcome = self._admit(parsed, now, fingerprint)
        first = outcome.earlier
        if outcome.decision == DUPLICATE and first is not None and first.fingerprint != fingerprint:
            return HttpOutcome(UNPROCESSABLE, {"error": _OTHER_BODY})  # a claim older than its key's record
        decision = first.decision if first is not None else outcome.decision
        if decision == COOLDOWN:
            return self._cooldown_answer(parsed.model_name, outcome.record_id, now)
        if outcome.decision in (ACCEPTED, COALESCED) and parsed.force:
            route = self.settings.model(parsed.model_name)
            if route is not None:
                self._states.pop(route.name, None)
                self._flusher.flush(route, ignore_quiet=True)
        record = self.ledger.event(outcome.record_id, [parsed.model_name])
        if record is not None and record.decision == REJECTED:  # its own data could not be pinned
            return HttpOutcome(UNPROCESSABLE, {"id": outcome.record_id, "error": record.reason})
        answer = {
            "id": outcome.record_id,
            "decision": record.decision if record else outcome.decision,
            "reason": record.reason if record else outcome.reason,
            "status_url": f"{base}/{outcome.record_id}" if base else outcome.record_id,
        }
        return HttpOutcome(202, answer)

    def _cooldown_answer(self, model_name: str, record_id: str, now: datetime) -> HttpOutcome:
        state, _ = self.ledger.load_state(model_name)
        verdict = flush_verdict(state, now, self._policy)
        retry_after = max(1, round(verdict.retry_after_seconds or self.settings.cooldown_seconds))
        over_budget = state.runs_on(now) >= self.settings.max_runs_per_day
        body = {"id": record_id, "decision": COOLDOWN, "reason": verdict.reason}
        return HttpOutcome(429 if over_budget else 409, body, {"Retry-After": str(retry_after)})

    def describe(self, identifier: str) -> dict[str, Any] | None:
        """What became of an HTTP request (by its event record id) or a submission (by its id)."""
        try:
            check_record_id(identifier, "retraining id")
        except LedgerError:
            return None  # not an id this ledger could hold
        event = self.ledger.event(identifier, [route.name for route in self.settings.models])
        submission_id = event.submission if event else identifier
        submission = self.ledger.submission(submission_id) if submission_id else None
        if event is None and submission is None:
            return None
        report: dict[str, Any] = {"id": identifier}
        if event is not None:
            report.update(decision=event.decision, reason=event.reason, submission=event.submission)
        if submission is not None:
            report.update(submission_status=submission.status, job_name=submission.job_name)
            # The run's outcome (the gate's decision, a failed step) in its own object: the event's
            # `decision` above is the front door's, a different thing.
            outcome = {key: value for key, value in submission.details.items() if key in OUTCOME_KEYS}
            if outcome:
                report["outcome"] = outcome
            if submission.estimate is not None:
                report.update(estimate=dict(submission.estimate))
        return report

    # -- flushing -----------------------------------------------------------------------------------------

    def flush(self, ignore_quiet: bool = False) -> list[SubmissionRecord]:
        """For every served model: recover and reconcile its run in flight, then submit its pending batch
        if the policy says it is time. A model whose flush lease another flush holds is left to it."""
        self._states.clear()  # this instance's flush changes the states: the next event reads them again
        return [
            record for route in self.settings.models for record in self._flusher.flush(route, ignore_quiet)
        ]

    def verdicts(self) -> dict[str, FlushVerdict]:
        """Each model's verdict at its last flush here: why nothing was submitted."""
        return dict(self._flusher.verdicts)

    def ledger_snapshot(self) -> dict[str, Any]:
        return self.ledger.snapshot()


def request_fingerprint(body: bytes) -> str:
    """The body's meaning, hashed: the same JSON object however its keys are ordered or spaced."""
    try:
        canonical = json.dumps(
            json.loads(body) if body.strip() else {}, sort_keys=True, separators=(",", ":")
        )
    except ValueError:
        canonical = body.decode("utf-8", "replace")  # parse_http_retrain refused it already
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def status_base(request_url: str) -> str:
    """Where to ask what became of a request, less its id: the request's own URL without its query (a
    function key travels there), fragment or user info ('' for none). An IPv6 host keeps its brackets. A
    URL with no valid host and port (port 99999, a broken bracket) is a ValueError naming its host part,
    raised before any claim is written."""
    if not request_url:
        return ""
    authority = re.split(r"[/?#]", request_url.split("//", 1)[-1], maxsplit=1)[0]
    host_part = authority.rpartition("@")[2]  # never the user info
    try:
        parts = urlsplit(request_url)
        port = parts.port
    except ValueError:
        raise ValueError(
            f"the request URL's host and port {quoted(host_part, 80)} do not parse; expected a host name "
            "or [IPv6 address], and a port from 1 to 65535"
        ) from None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
