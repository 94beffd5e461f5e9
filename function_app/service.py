"""The front door: parse -> claim -> policy -> ledger -> submit. Every trigger handler delegates here.

Event Grid delivers at least once, and two Function instances may handle the same event at once. The
ledger's create-if-absent claim on the event's dedupe key and its compare-and-set on the model's state are
what make them submit once: a claim that loses is a duplicate; a state save that loses is retried from a
fresh read. A claim written by an instance that died before saving the state is applied again by the next
delivery (`needs_apply`). Permanent rejections are recorded and returned; transient failures (storage,
the submitter) raise, so Event Grid retries.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from components.cost import with_estimate
from components.data_version import DataManifest
from components.request import TERMINAL_STATES, RunRequest, Submitter
from function_app.events.http_retrain import HttpRejection, parse_http_retrain
from function_app.events.parsing import parse_blob_created, parse_drift_alert, parse_event
from function_app.events.triggers import (
    ACCEPTED,
    COOLDOWN,
    DUPLICATE,
    KIND_BLOB,
    KIND_DRIFT,
    REJECTED,
    SUBMITTED,
    Rejection,
    TriggerRequest,
)
from function_app.ledger.local import Ledger, LedgerBusyError
from function_app.ledger.records import (
    SUBMITTING,
    EventRecord,
    InputPin,
    LedgerError,
    SubmissionRecord,
    check_record_id,
)
from function_app.pinning import DataPinner, batch_manifest
from function_app.policy.rules import (
    FlushVerdict,
    ModelState,
    PendingItem,
    PolicySettings,
    batch_kind,
    finish_submission,
    flush_verdict,
    latest_blobs,
    on_arrival,
    start_submission,
)
from function_app.settings.app import AppSettings

log = logging.getLogger(__name__)

_SAVE_ATTEMPTS = 20  # compare-and-set retries before the event is handed back to Event Grid to retry
_REASONS = {
    ACCEPTED: "accepted for the next run",
    "debounced": "joined the pending batch; it is submitted after the quiet period",
    "coalesced": "a run is in flight or cooling down; carried into the next run",
    COOLDOWN: "cooling down or over the day's budget; kept for the next run",
    DUPLICATE: "already pending or in flight",
}


@dataclass(frozen=True)
class EventOutcome:
    record_id: str
    event_id: str | None
    kind: str
    decision: str
    reason: str
    submission: str | None = None


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
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self._submitter = submitter
        self._pinner = pinner
        self._clock = clock
        self._policy = PolicySettings(
            settings.debounce_quiet_seconds,
            settings.debounce_max_wait_seconds,
            settings.cooldown_seconds,
            settings.max_runs_per_day,
        )

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
        self.ledger.record_event(record)
        # DEBUG: the trigger's handler logs the decision, naming the blob; a second line would repeat it.
        log.debug("rejected %s event %s: %s", rejection.kind, rejection.event_id, rejection.reason)
        return EventOutcome(record.id, rejection.event_id, rejection.kind, REJECTED, rejection.reason)

    def _admit(self, request: TriggerRequest, now: datetime) -> EventOutcome:
        claim = EventRecord.claim(request, ACCEPTED, "claimed; being applied to the model's state")
        if not self.ledger.claim_event(claim):
            earlier = self.ledger.event(claim.id)
            if earlier is None or not earlier.needs_apply:
                return self._duplicate(request, earlier, now)
            claim = earlier  # its claimer stopped before the state save: apply it now
        decision = self._apply(request, now)
        if decision == DUPLICATE:
            # Another delivery of this event reached the state first and records the decision on the
            # claim; this delivery is a duplicate of it, recorded on its own.
            return self._duplicate(request, self.ledger.event(claim.id), now)
        reason = _REASONS.get(decision, decision)
        self.ledger.update_event(claim.with_decision(decision, reason))
        return EventOutcome(claim.id, request.event_id, request.kind, decision, reason)

    def _duplicate(self, request: TriggerRequest, earlier: EventRecord | None, now: datetime) -> EventOutcome:
        what = f"{earlier.decision} as {earlier.id}" if earlier else "claimed by another delivery"
        reason = f"duplicate of an event already {what}"
        record = EventRecord.delivery(
            request.kind,
            DUPLICATE,
            reason,
            now,
            model_name=request.model_name,
            event_id=request.event_id,
            dedupe_key=request.dedupe_key,
        )
        self.ledger.record_event(record)
        return EventOutcome(record.id, request.event_id, request.kind, DUPLICATE, reason)

    def _apply(self, request: TriggerRequest, now: datetime) -> str:
        for _ in range(_SAVE_ATTEMPTS):
            state, token = self.ledger.load_state(request.model_name)
            decision, new_state = on_arrival(state, request, now, self._policy)
            if decision == DUPLICATE or self.ledger.save_state(request.model_name, new_state, token):
                return decision
        raise LedgerBusyError(
            f"model {request.model_name!r}: its state kept changing during {_SAVE_ATTEMPTS} attempts; retry"
        )

    # -- HTTP ---------------------------------------------------------------------------------------------

    def retrain(self, body: bytes, headers: Mapping[str, str], base_url: str = "") -> HttpOutcome:
        now = self._clock()
        parsed = parse_http_retrain(body, headers, self.settings, now)
        if isinstance(parsed, HttpRejection):
            self.ledger.record_event(EventRecord.delivery("http", REJECTED, parsed.reason, now))
            return HttpOutcome(parsed.status, {"error": parsed.reason})
        outcome = self._admit(parsed, now)
        if outcome.decision == COOLDOWN:
            return self._cooldown_answer(outcome, now)
        if outcome.decision in (ACCEPTED, "coalesced") and parsed.force:
            self.flush(ignore_quiet=True)
        record = self.ledger.event(outcome.record_id)
        body_out = {
            "id": outcome.record_id,
            "decision": record.decision if record else outcome.decision,
            "reason": record.reason if record else outcome.reason,
            "status_url": f"{base_url.rstrip('/')}/{outcome.record_id}" if base_url else outcome.record_id,
        }
        return HttpOutcome(202, body_out)

    def _cooldown_answer(self, outcome: EventOutcome, now: datetime) -> HttpOutcome:
        state, _ = self.ledger.load_state(self.settings.model_name)
        verdict = flush_verdict(state, now, self._policy)
        retry_after = max(1, round(verdict.retry_after_seconds or self.settings.cooldown_seconds))
        over_budget = state.runs_on(now) >= self.settings.max_runs_per_day
        status = 429 if over_budget else 409
        body = {"id": outcome.record_id, "decision": COOLDOWN, "reason": verdict.reason}
        return HttpOutcome(status, body, {"Retry-After": str(retry_after)})

    def describe(self, identifier: str) -> dict[str, Any] | None:
        """What became of an HTTP request (by its event record id) or a submission (by its id)."""
        try:
            check_record_id(identifier, "retraining id")
        except LedgerError:
            return None  # not an id this ledger could hold
        event = self.ledger.event(identifier)
        submission_id = event.submission if event else identifier
        submission = self.ledger.submission(submission_id) if submission_id else None
        if event is None and submission is None:
            return None
        report: dict[str, Any] = {"id": identifier}
        if event is not None:
            report.update(decision=event.decision, reason=event.reason, submission=event.submission)
        if submission is not None:
            report.update(submission_status=submission.status, job_name=submission.job_name)
            report.update({key: value for key, value in submission.details.items() if key in _OUTCOME_KEYS})
            if submission.estimate is not None:
                report.update(estimate=dict(submission.estimate))
        return report

    # -- flushing -----------------------------------------------------------------------------------------

    def flush(self, ignore_quiet: bool = False) -> list[SubmissionRecord]:
        """Reconcile the run in flight, then submit the pending batch if the policy says it is time."""
        now = self._clock()
        model = self.settings.model_name
        self._reconcile(model, now)
        state, token = self.ledger.load_state(model)
        verdict: FlushVerdict = flush_verdict(state, now, self._policy, ignore_quiet=ignore_quiet)
        if not verdict.submit:
            log.debug("flush %s: not now (%s)", model, verdict.reason)
            return []
        submission_id = f"s-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        new_state, items = start_submission(state, submission_id, now)
        if not self.ledger.save_state(model, new_state, token):
            return []  # another instance took this batch; it submits it
        return [self._submit(model, submission_id, items, state, now)]

    def _previous_manifest(self, state: ModelState) -> DataManifest | None:
        if state.last_finished_id is None:
            return None
        previous = self.ledger.submission(state.last_finished_id)
        if previous is None or "manifest" not in previous.details:
            return None
        return DataManifest.from_json(previous.details["manifest"])

    def _submit(
        self, model: str, submission_id: str, items: tuple[PendingItem, ...], state: ModelState, now: datetime
    ) -> SubmissionRecord:
        blobs = latest_blobs(items)
        record = SubmissionRecord(
            id=submission_id,
            model_name=model,
            kind=batch_kind(items),
            status=SUBMITTING,
            created_at=now,
            updated_at=now,
            inputs=tuple(InputPin(blob.url, f"etag:{blob.etag}") for blob in blobs),
            events=tuple(item.event_id for item in items),
        )
        self.ledger.create_submission(record)
        self._mark_events(items, submission_id)
        previous = self._previous_manifest(state)
        if not blobs and previous is None:
            return self._finish_without_data(record, now)
        manifest = batch_manifest(blobs, previous)
        request, estimate = with_estimate(
            RunRequest(
                model_name=model,
                data=self._pinner.pin(manifest, model),
                trigger=_trigger_tags(items, submission_id),
                parameters=self.settings.pipeline_parameters,
                processes_per_instance=self.settings.processes_per_node,
                instance_count=self.settings.nodes,
            ),
            self.settings.cost,
        )
        log.info("submission %s of %s: %s", submission_id, manifest.version, estimate.summary())
        # Recorded before the submitter is called, so the ledger shows what a trigger is about to spend
        # even when the submission then fails.
        record = record.with_estimate(estimate.to_dict(), self._clock())
        self.ledger.update_submission(record)
        submission = self._submitter.submit(request)
        updated = record.with_status(
            submission.status,
            self._clock(),
            data_version=manifest.version,
            job_name=submission.job_name,
            backend=submission.backend,
            details={"manifest": manifest.to_json(), **_outcome(submission.details)},
        )
        self.ledger.update_submission(updated)
        log.info(
            "submitted %s as %s (%s): %s",
            submission_id,
            submission.job_name,
            manifest.version,
            submission.status,
        )
        return updated

    def _finish_without_data(self, record: SubmissionRecord, now: datetime) -> SubmissionRecord:
        reason = "nothing to train on: no data has landed yet"
        failed = record.with_status("Failed", now, details={"reason": reason})
        self.ledger.update_submission(failed)
        self._finish_in_state(record.model_name, record.id, now, "Completed")
        return failed

    def _mark_events(self, items: tuple[PendingItem, ...], submission_id: str) -> None:
        for item in items:
            record = self.ledger.event(_claim_id(item.dedupe_key))
            if record is not None:
                self.ledger.update_event(
                    record.with_decision(SUBMITTED, f"in submission {submission_id}", submission_id)
                )

    def _reconcile(self, model: str, now: datetime) -> None:
        """Finish the run in flight once its job has ended, so the next batch may go."""
        state, _ = self.ledger.load_state(model)
        if state.in_flight_id is None:
            return
        record = self.ledger.submission(state.in_flight_id)
        status = "Failed"  # a submission never recorded never reached the submitter
        if record is not None and record.job_name is not None:
            status = self._submitter.status(record.job_name).status
            if status not in TERMINAL_STATES:
                return
            self.ledger.update_submission(record.with_status(status, now))
        elif record is not None and record.status != SUBMITTING:
            status = record.status
        self._finish_in_state(model, state.in_flight_id, now, status)

    def _finish_in_state(self, model: str, submission_id: str, now: datetime, status: str) -> None:
        for _ in range(_SAVE_ATTEMPTS):
            state, token = self.ledger.load_state(model)
            new_state = finish_submission(state, submission_id, now, status=status)
            if new_state is state or self.ledger.save_state(model, new_state, token):
                return
        raise LedgerBusyError(f"model {model!r}: could not record the end of {submission_id}; retry")

    def ledger_snapshot(self) -> dict[str, Any]:
        return self.ledger.snapshot()


_OUTCOME_KEYS = ("registered_version", "decision", "reasons", "failed_step", "log_tail", "run_id")


def _outcome(details: Mapping[str, Any]) -> dict[str, Any]:
    return {key: details[key] for key in _OUTCOME_KEYS if key in details}


def _claim_id(dedupe_key: str) -> str:
    from function_app.ledger.records import event_id_for_key

    return event_id_for_key(dedupe_key)


def _trigger_tags(items: tuple[PendingItem, ...], submission_id: str) -> dict[str, str]:
    kind = batch_kind(items)
    first = next(item for item in items if item.kind == kind)
    return {"kind": kind, "event_id": first.event_id, "submission": submission_id, "events": str(len(items))}
