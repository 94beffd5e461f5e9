"""Flushing one model: recover what a crashed flush left, then submit the pending batch when the policy says.

A flush runs under the model's flush lease (one holder at a time), in this order, each step durable before
the next, so that a flush killed between any two of them is recovered exactly once by the next holder:

1. reconcile: finish the submission in flight once its job has ended (or never reached the submitter);
2. assemble the batch from the model's pending claims, and ask the policy whether it goes now;
3. save the model's state with the submission in flight (this counts it in the day's budget);
4. create the submission's record, `Submitting`;
5. tag the batch's claims with the submission's id (they are no longer pending);
6. pin the data, submit, and record the job.

A crash after 3 leaves a state naming a submission whose record may not exist (recovery writes it, failed:
nothing reached the submitter), or exists without a job (recovery asks the submitter for the job by its
name, which a submitter derives from the model and data version: found, it is adopted; not found, the
record fails). A failed submission returns its claims to pending, once. The record a recovery writes also
fences a flush that lost its lease while stalled: its own create or retag then fails and it stops.

A submitter may refuse the run in 6 before anything runs (`RunRefused`: the local run's pre-run check, a
class the data lacks): then the record is marked held (failed, with the reason), its claims return to
pending saying why, and the state forgets the submission and uncounts it from the day's budget, in that
order; a crash after the mark is finished by the next holder, which sees the held record.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from components.cost import CostSettings, with_estimate
from components.data_version import DataManifest
from components.errors import JobNotFound, RunRefused, SubmissionError
from components.outcome import PREPARED_KEY, REJECTED_KEY
from components.request import (
    COMPLETED,
    FAILED,
    TERMINAL_STATES,
    DataRef,
    RunRequest,
    Submitter,
    job_name_for,
)
from components.task_ref import parse_task_reference
from core.secrets import displayable_url
from core.storage.leases import Holder
from core.text import escaped
from function_app.events.triggers import COALESCED, KIND_BLOB, REJECTED, SUBMITTED
from function_app.ledger.ledger import PENDING, Claim, Ledger
from function_app.ledger.records import SUBMITTING, InputPin, LedgerBusyError, SubmissionRecord
from function_app.pinning import ASSET_PREFIX, DataPinner, PinError, Vanished, batch_manifest
from function_app.policy.rules import (
    FlushVerdict,
    ModelState,
    PendingItem,
    PolicySettings,
    batch_kind,
    finish_submission,
    flush_verdict,
    latest_blobs,
    start_submission,
    withdraw_submission,
    without_future_times,
)
from function_app.settings.models import ModelRoute
from function_app.task_check import NoTaskCheck, TaskCheck

log = logging.getLogger(__name__)

# The durable steps of a flush, in order, as `on_step` hears them (tests stop a flush at each).
STEPS = ("state-saved", "record-created", "claims-taken", "submitted")
HELD_STEP = "held"  # instead of "submitted": the submitter refused, the record is marked held, not withdrawn
# A flush is a few store round trips and one submission; the Functions host stops a function after
# host.json's functionTimeout (5 min). A flush lease a blob holder has kept for twice that is no flush's.
STUCK_FLUSH_LEASE_SECONDS = 600
BREAK_LEASE_HELP = "README, 'A flush lease that never frees', says how to break it"
BASIS = "basis"  # a submission on a request's own data: the submission whose manifest is the landing data
# The tag of a claim whose file was gone or changed when its batch was pinned: dropped, never retried.
DROPPED = "dropped"
# A submission its submitter refused before anything ran (a pre-run check): held and withdrawn, not a run.
HELD = "held"
# A submission's task (its reference), and the prepared data version its prep step builds on (the model's
# last good one: {"uri", "task", FAILED_RUNS}), which the next submission carries forward until one completes.
TASK, PREVIOUS, FAILED_RUNS = "task", "previous_prepared", "failed_runs"
# Runs in a row that failed given one previous prepared version, after which it is given no more.
MAX_FAILED_ON_PREVIOUS = 2
OUTCOME_KEYS = (
    PREPARED_KEY,
    "registered_version",
    "decision",
    "reasons",
    "failed_step",
    "log_tail",
    "run_id",
    REJECTED_KEY,
)


@dataclass(frozen=True)
class SubmissionPlan:
    """What every run the front door submits is given beyond its model's own route: the app's pipeline
    parameters (over the route's), the processes per node and node count, and the cost settings that
    price it."""

    parameters: Mapping[str, str]
    processes_per_node: int
    nodes: int
    cost: CostSettings


def new_submission(
    submission_id: str,
    model: str,
    kind: str,
    status: str,
    created_at: datetime,
    events: tuple[str, ...],
    details: Mapping[str, Any],
    *,
    raw_version: str | None = None,
    inputs: tuple[InputPin, ...] = (),
    updated_at: datetime | None = None,
) -> SubmissionRecord:
    """A submission's first record, as a flush writes it: what it pins (none, for one that failed before
    pinning), updated when it was created unless a recovery writes it later."""
    return SubmissionRecord(
        id=submission_id,
        model_name=model,
        kind=kind,
        status=status,
        created_at=created_at,
        updated_at=updated_at or created_at,
        raw_version=raw_version,
        inputs=inputs,
        events=events,
        details=details,
    )


class Flusher:
    def __init__(
        self,
        ledger: Ledger,
        submitter: Submitter,
        pinner: DataPinner,
        clock: Callable[[], datetime],
        policy: PolicySettings,
        plan: SubmissionPlan,
        on_step: Callable[[str], None] | None = None,
        task_check: TaskCheck | None = None,
    ) -> None:
        self._ledger = ledger
        self._submitter = submitter
        self._pinner = pinner
        self._clock = clock
        self._policy = policy
        self._plan = plan
        self._on_step = on_step or (lambda step: None)
        self._task_check = task_check or NoTaskCheck()
        self.verdicts: dict[str, FlushVerdict] = {}  # each model's last verdict, for `retrain flush` to say

    def flush(self, route: ModelRoute, ignore_quiet: bool = False) -> list[SubmissionRecord]:
        model = route.name
        with self._ledger.flush_lease(model) as lease:
            if lease is None:
                reason, stuck = lease_refusal(self._ledger.flush_holder(model), self._clock())
                self.verdicts[model] = FlushVerdict(False, reason)
                (log.warning if stuck else log.info)("flush %s: %s", model, reason)
                return []
            self._reconcile(route)
            now = self._clock()
            state, version = self._settled(model, now)
            pending = self._batch(self._ledger.claims(model))
            view = replace(state, pending=tuple(_item(claim) for claim in pending))
            verdict = flush_verdict(view, now, self._policy, ignore_quiet=ignore_quiet)
            self.verdicts[model] = verdict
            if not verdict.submit:
                log.debug("flush %s: not now (%s)", model, verdict.reason)
                return []
            refusal = self._task_check.refusal(route, {**route.parameters, **self._plan.parameters})
            if refusal is not None:  # before anything is recorded or counted in the budget
                return self._hold(model, pending, refusal)
            submission_id = f"s-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
            try:
                manifest, named = self._data(route, state, view.pending)
            except PinError as error:
                return [self._refuse(model, submission_id, pending, view.pending, str(error), now)]
            dropped: tuple[Vanished, ...] = ()
            if manifest is not None and not any(item.data_uri for item in view.pending):
                manifest, pending, dropped = self._drop_vanished(model, manifest, pending)
                if not pending:  # recorded on the claims; nothing started, so no budget is spent
                    self.verdicts[model] = FlushVerdict(False, _nothing_left(dropped))
                    return []
                view = replace(view, pending=tuple(_item(claim) for claim in pending))
            raw_version = manifest.version if manifest is not None else named and named.version
            new_state, items = start_submission(view, submission_id, now, raw_version)
            if not self._ledger.save_state(model, new_state, version):
                raise LedgerBusyError(f"model {model!r}: its state changed under the flush lease; retry")
            self._on_step("state-saved")
            record = new_submission(
                submission_id,
                model,
                batch_kind(items),
                SUBMITTING,
                now,
                tuple(claim.record.id for claim in pending),
                # A request's own data is not the landing data: the next batch builds on this one's basis.
                {
                    **({BASIS: self._basis_id(state)} if any(item.data_uri for item in items) else {}),
                    **({DROPPED: [gone.line() for gone in dropped]} if dropped else {}),
                    **self._lineage(route, state),
                },
                raw_version=raw_version,
                inputs=_inputs(manifest, items),
            )
            if not self._ledger.create_submission(record):
                raise LedgerBusyError(f"submission {submission_id} was recorded by another flush; stopping")
            self._on_step("record-created")
            taken = f"in submission {submission_id}"
            self._ledger.retag(
                pending, lambda event: event.with_decision(SUBMITTED, taken, submission_id), submission_id
            )
            self._on_step("claims-taken")
            if record.raw_version is None:
                return [self._finish_without_data(record)]
            if lease.lost:
                raise LedgerBusyError(
                    f"flush of {model!r} lost its lease before submitting; the next one recovers"
                )
            submitted = self._submit(route, record, items, manifest, named, state.last_submission_at)
            return [] if submitted is None else [submitted]

    def _settled(self, model: str, now: datetime) -> tuple[ModelState, str | None]:
        """The model's state, with a time another instance's fast clock put in the future clamped to now
        and saved, so that no cooldown measured from it lasts longer than configured."""
        state, version = self._ledger.load_state(model)
        settled = without_future_times(state, now)
        if settled is state:
            return state, version
        if not self._ledger.save_state(model, settled, version):
            raise LedgerBusyError(f"model {model!r}: its state changed under the flush lease; retry")
        return self._ledger.load_state(model)

    # -- the batch --------------------------------------------------------------------------------------

    @staticmethod
    def _batch(pending: list[Claim]) -> list[Claim]:
        """The pending claims one submission takes: all of them, except that a request naming its own data
        goes alone (the oldest first), since its run pins exactly that data."""
        explicit = [claim for claim in pending if _item(claim).data_uri is not None]
        return explicit[:1] if explicit else pending

    def _data(
        self, route: ModelRoute, state: ModelState, items: tuple[PendingItem, ...]
    ) -> tuple[DataManifest | None, DataRef | None]:
        """What the batch trains on: a manifest to pin, or a registered data asset as named; (None, None)
        when no data has landed yet. A request's own blob folder is listed now, each blob at its eTag."""
        named = next((item.data_uri for item in items if item.data_uri), None)
        if named is not None and named.startswith(ASSET_PREFIX):
            return None, DataRef(named.rsplit(":", 1)[1], named)
        if named is not None:
            suffixes = route.scope.suffixes if route.scope is not None else ()
            return self._pinner.folder_manifest(named, suffixes, route.name), None
        blobs = latest_blobs(items)
        previous = self._previous_manifest(state)
        if not blobs and previous is None:
            return None, None
        return batch_manifest(blobs, previous, route.scope), None

    def _drop_vanished(
        self, model: str, manifest: DataManifest, pending: list[Claim]
    ) -> tuple[DataManifest | None, list[Claim], tuple[Vanished, ...]]:
        """The batch without the files gone or changed since they were listed (deleted or replaced
        landing data is ordinary): each is named in one line, and its claims end `DROPPED` with the reason,
        so they are never retried (a replaced file's newer event brings its new version). Returns the
        manifest left (None if no file is), the claims left, and what was dropped."""
        vanished = self._pinner.vanished(manifest, model)
        if not vanished:
            return manifest, pending, ()
        why = {gone.file.source: gone.line() for gone in vanished}
        for gone in vanished:
            log.warning("flush %s: dropped from the batch: %s", model, gone.line())
        dropped = [claim for claim in pending if (_source(claim) or "") in why]
        self._ledger.retag(
            dropped,
            lambda event: event.with_decision(REJECTED, f"dropped from the batch: {why[_blob_url(event)]}"),
            DROPPED,
        )
        kept = [claim for claim in pending if (_source(claim) or "") not in why]
        files = tuple(file for file in manifest.files if file.source not in why)
        return (DataManifest(files) if files else None), kept, vanished

    def _previous_manifest(self, state: ModelState) -> DataManifest | None:
        """The manifest of every blob landed so far: the last finished submission's, or, when that one
        trained on a request's own data, the one it names as its basis."""
        basis_id = self._basis_id(state)
        basis = self._ledger.submission(basis_id) if basis_id is not None else None
        if basis is None or "manifest" not in basis.details:
            return None
        # A file its prep left out does not fit the model: it is carried into no later version.
        left_out = {
            str(item.get("name"))
            for item in basis.details.get(REJECTED_KEY) or ()
            if isinstance(item, Mapping)
        }
        files = tuple(
            file
            for file in DataManifest.from_json(basis.details["manifest"]).files
            if file.name not in left_out
        )
        return DataManifest(files) if files else None

    def _basis_id(self, state: ModelState) -> str | None:
        if state.last_finished_id is None:
            return None
        previous = self._ledger.submission(state.last_finished_id)
        if previous is None:
            return None
        return previous.details.get(BASIS, previous.id)

    def _lineage(self, route: ModelRoute, state: ModelState) -> dict[str, Any]:
        """What a new submission's record says it prepares from: its task, and the model's last good
        prepared data version, which its prep step builds on (`_previous_prepared`) when the same task made
        it: another task's is not a version this one reads."""
        task = parse_task_reference(route.task, None, "task").text
        previous = self._previous_prepared(state)
        if previous is not None and previous.get("task") != task:
            log.info(
                "flush %s: the last good prepared data version is task %s's, not %s's; the next run is "
                "prepared without it",
                route.name, escaped(str(previous.get("task"))), escaped(task),
            )  # fmt: skip
            previous = None
        return {TASK: task, **({PREVIOUS: previous} if previous is not None else {})}

    def _previous_prepared(self, state: ModelState) -> dict[str, Any] | None:
        """The model's last good prepared data version: the prepare step's output of the last submission
        that completed (trained and evaluated, whether or not the gate promoted it: its data was good), as
        the last finished submission knows it: its own output if it completed, else the version it was
        given, which it carries forward. Its schema is the model's, so a new file of another schema, however
        large, is the one prep leaves out. None before any; and once MAX_FAILED_ON_PREVIOUS runs in a row
        given one version have failed (a job output deleted from its datastore fails every job reading it),
        the next run is prepared without it."""
        last = None if state.last_finished_id is None else self._ledger.submission(state.last_finished_id)
        if last is None:
            return None
        own, task = last.details.get(PREPARED_KEY), last.details.get(TASK)
        if last.status == COMPLETED and isinstance(own, str) and isinstance(task, str):
            return {"uri": own, "task": task, FAILED_RUNS: 0}
        given = last.details.get(PREVIOUS)
        if not isinstance(given, Mapping) or not isinstance(given.get("uri"), str):
            return None
        failed = given.get(FAILED_RUNS)
        failed = failed if isinstance(failed, int) and not isinstance(failed, bool) else 0
        if last.status != COMPLETED and last.job_name is not None:  # its run was given it, and failed
            failed += 1
        if failed >= MAX_FAILED_ON_PREVIOUS:
            log.warning(
                "flush %s: %d runs in a row given the prepared data version %s failed; the next run is "
                "prepared without it, its schema from most of its raw data",
                last.model_name, failed, displayable_url(str(given["uri"])),
            )  # fmt: skip
            return None
        return {**given, FAILED_RUNS: failed}

    # -- submitting -------------------------------------------------------------------------------------

    def _submit(
        self,
        route: ModelRoute,
        record: SubmissionRecord,
        items: tuple[PendingItem, ...],
        manifest: DataManifest | None,
        named: DataRef | None,
        cooldown_from: datetime | None,
    ) -> SubmissionRecord | None:
        """The submission sent, and recorded as its submitter reports it; None when the submitter refused
        it before anything ran (its pre-run check): the batch is then held, and no budget spent."""
        try:
            data = named if manifest is None else self._pinner.pin(manifest, route.name)
        except PinError as error:  # a file went after the batch was checked: this one fails, once
            return self._pin_failed(record, str(error))
        assert data is not None  # the record has a data version only when there is data
        previous = record.details.get(PREVIOUS)  # the model's last good prepared data version (_lineage)
        request, estimate = with_estimate(
            RunRequest(
                model_name=route.name,
                data=data,
                trigger=_trigger_tags(items, record.id),
                parameters={**route.parameters, **self._plan.parameters},
                processes_per_instance=self._plan.processes_per_node,
                instance_count=self._plan.nodes,
                task=route.task,
                task_options=route.task_options,
                previous_prepared=str(previous["uri"]) if isinstance(previous, Mapping) else None,
            ),
            self._plan.cost,
        )
        log.info("submission %s of %s: %s", record.id, data.version, estimate.summary())
        # Recorded before the submitter is called, so the ledger shows what a trigger is about to spend
        # even when the submission then fails.
        record = record.with_estimate(estimate.to_dict(), self._clock())
        self._ledger.update_submission(record)
        try:
            submission = self._submitter.submit(request)
        except RunRefused as refusal:  # nothing ran: the batch waits for a fix, as a refused task's does
            held = self._held(record, str(refusal), cooldown_from)
            self._on_step(HELD_STEP)
            self._withdraw(held)
            return None
        self._on_step("submitted")
        details = {**record.details, **_outcome(submission.details)}
        if manifest is not None:
            details["manifest"] = manifest.to_json()
        updated = record.with_status(
            submission.status,
            self._clock(),
            job_name=submission.job_name,
            backend=submission.backend,
            details=details,
        )
        self._ledger.update_submission(updated)
        log.info(
            "submitted %s as %s (%s): %s", record.id, submission.job_name, data.version, submission.status
        )
        if submission.status in TERMINAL_STATES:
            self._leave_out_rejected(updated)
            self._finish(record.model_name, record.id, submission.status)
        return updated

    def _refuse(
        self,
        model: str,
        submission_id: str,
        pending: list[Claim],
        items: tuple[PendingItem, ...],
        reason: str,
        now: datetime,
    ) -> SubmissionRecord:
        """A request whose own data cannot be pinned (an empty folder, one gone): recorded as a failed
        submission that started no run, so it neither blocks the model's later batches nor costs budget."""
        record = new_submission(
            submission_id,
            model,
            batch_kind(items),
            FAILED,
            now,
            tuple(claim.record.id for claim in pending),
            {"reason": reason},
        )
        self._ledger.create_submission(record)
        self._ledger.retag(
            pending, lambda event: event.with_decision(REJECTED, reason, submission_id), submission_id
        )
        log.warning("submission %s of %s not started: %s", submission_id, model, reason)
        return record

    def _pin_failed(self, record: SubmissionRecord, reason: str) -> SubmissionRecord:
        """The batch's data could not be pinned as checked (a file went in the moment between): nothing
        reached the submitter; the submission fails naming the file, and its claims return to pending,
        where the next flush drops that file."""
        failed = record.with_status(FAILED, self._clock(), details={**record.details, "reason": reason})
        self._ledger.update_submission(failed)
        log.warning("submission %s of %s not started: %s", record.id, record.model_name, reason)
        self._end(record.model_name, record.id, FAILED)
        return failed

    def _hold(self, model: str, pending: list[Claim], reason: str) -> list[SubmissionRecord]:
        """A batch whose task refuses its gate policy: no submission, no budget spent. Its claims stay
        pending, each saying why (written once per reason), and go with the next flush once the task is
        fixed."""
        held = f"held: {reason}"
        self.verdicts[model] = FlushVerdict(False, held)
        self._ledger.retag(
            [claim for claim in pending if claim.record.reason != held],
            lambda event: event.with_decision(event.decision, held, None),
            PENDING,
        )
        log.warning("flush %s: %s", model, held)
        return []

    def _held(
        self, record: SubmissionRecord, reason: str, cooldown_from: datetime | None
    ) -> SubmissionRecord:
        """The submission refused by its submitter before anything ran, recorded as failed and held, with
        the start of the submission before it, from which the cooldown counts again (`_withdraw`)."""
        held = record.with_status(
            FAILED,
            self._clock(),
            details={
                **record.details,
                "reason": f"held: {reason}",
                HELD: {"cooldown_from": None if cooldown_from is None else cooldown_from.isoformat()},
            },
        )
        self._ledger.update_submission(held)
        return held

    def _withdraw(self, record: SubmissionRecord) -> None:
        """A held submission (`_held`) withdrawn as if never started: its claims return to pending, saying
        why, and the model's state forgets it, uncounted in the day's budget. Each step may be done again: a
        flush that stopped between them is finished by the next one (_reconcile)."""
        model, held = record.model_name, str(record.details["reason"])
        self._ledger.retag(
            self._ledger.claims(model, tag=record.id),
            lambda event: event.with_decision(COALESCED, held, None),
            PENDING,
        )
        since = (record.details.get(HELD) or {}).get("cooldown_from")
        state, version = self._ledger.load_state(model)
        new_state = withdraw_submission(
            state, record.id, None if since is None else datetime.fromisoformat(since)
        )
        if new_state is not state and not self._ledger.save_state(model, new_state, version):
            raise LedgerBusyError(f"model {model!r}: its state changed under the flush lease; retry")
        self.verdicts[model] = FlushVerdict(False, held)
        log.warning("flush %s: %s", model, held)

    def _finish_without_data(self, record: SubmissionRecord) -> SubmissionRecord:
        reason = "nothing to train on: no data has landed yet"
        failed = record.with_status(FAILED, self._clock(), details={**record.details, "reason": reason})
        self._ledger.update_submission(failed)
        self._finish(record.model_name, record.id, "Completed")  # nothing to retry: its items are done
        return failed

    # -- recovery ---------------------------------------------------------------------------------------

    def _reconcile(self, route: ModelRoute) -> None:
        """Finish the submission in flight once its job has ended; recover one a crashed flush left."""
        model = route.name
        state, _ = self._ledger.load_state(model)
        submission_id = state.in_flight_id
        if submission_id is None:
            return
        now = self._clock()
        record = self._ledger.submission(submission_id)
        if record is None:
            # Absent, or unreadable and moved aside: a job the submitter has by the batch's name was
            # submitted all the same, and is followed from a record rebuilt, never started a second time.
            record = self._rebuilt_record(route, state, now)
        if record is None:
            # The flush that took this batch stopped before recording it: nothing reached the submitter.
            # The record written here also fences that flush, should it still be running.
            self._ledger.create_submission(
                new_submission(
                    submission_id,
                    model,
                    state.in_flight_kind or KIND_BLOB,  # a state saved before kinds were kept
                    FAILED,
                    state.in_flight_since or now,
                    (),
                    {
                        "reason": "the flush stopped before recording the submission; nothing was submitted",
                        **self._lineage(route, state),
                    },
                    updated_at=now,
                )
            )
            return self._end(model, submission_id, FAILED)
        if record.job_name is None and HELD in record.details:
            # Its submitter refused it before anything ran; the flush that held it stopped withdrawing it.
            return self._withdraw(record)
        if record.job_name is None and record.status == SUBMITTING:
            found = self._find_job(model, record.raw_version)
            if found is None:
                reason = (
                    "the flush stopped before the submitter accepted the job; its items return to pending"
                )
                failed = record.with_status(FAILED, now, details={**record.details, "reason": reason})
                self._ledger.update_submission(failed)
                return self._end(model, submission_id, FAILED)
            reason = found.details.get("reason") if found.status == FAILED else None
            record = record.with_status(
                found.status,
                now,
                job_name=found.job_name,
                backend=found.backend,
                details={**record.details, "reason": reason} if reason else record.details,
            )
            self._ledger.update_submission(record)
            # The flush may have stopped before taking every claim: take the rest now.
            still_pending = [
                claim for claim in self._ledger.claims(model) if claim.record.id in record.events
            ]
            taken = f"in submission {submission_id}"
            self._ledger.retag(
                still_pending, lambda e: e.with_decision(SUBMITTED, taken, submission_id), submission_id
            )
        status = record.status
        if record.job_name is not None:
            status, reason, outcome = self._job_status(record.job_name)
            if status not in TERMINAL_STATES:
                return None
            details = {**record.details, **outcome, **({"reason": reason} if reason else {})}
            record = record.with_status(status, now, details=details)
            self._ledger.update_submission(record)
            self._leave_out_rejected(record)
        elif status not in TERMINAL_STATES:
            status = FAILED
        return self._end(model, submission_id, status)

    def _rebuilt_record(self, route: ModelRoute, state: ModelState, now: datetime) -> SubmissionRecord | None:
        """The in-flight submission's record, written again when it cannot be read but its job exists
        (found by the name its raw data version gives, as for a flush that died before recording the job):
        its events are the claims it took, its manifest the one its batch makes on the last basis, so that
        the next batch builds on it. None when no job has that name: nothing reached the submitter."""
        assert state.in_flight_id is not None and state.in_flight_since is not None
        found = self._find_job(route.name, state.in_flight_raw_version)
        if found is None:
            return None
        claims = self._ledger.claims(route.name, tag=state.in_flight_id)
        items = tuple(_item(claim) for claim in claims)
        details: dict[str, Any] = {
            "rebuilt": "its record was unreadable; rebuilt from its job and claims",
            **self._lineage(route, state),
        }
        if any(item.data_uri for item in items):
            details[BASIS] = self._basis_id(state)  # a request's own data: the next batch builds on the basis
        else:
            details["manifest"] = batch_manifest(
                latest_blobs(items), self._previous_manifest(state), route.scope
            ).to_json()
        record = new_submission(
            state.in_flight_id,
            route.name,
            state.in_flight_kind or KIND_BLOB,
            found.status,
            state.in_flight_since,
            tuple(claim.record.id for claim in claims),
            details,
            raw_version=state.in_flight_raw_version,
            inputs=tuple(InputPin(blob.url, f"etag:{blob.etag}") for blob in latest_blobs(items)),
            updated_at=now,
        ).with_status(found.status, now, job_name=found.job_name, backend=found.backend)
        if not self._ledger.create_submission(record):
            raise LedgerBusyError(f"submission {record.id} was recorded by another flush; stopping")
        log.warning(
            "submission %s of %s: its record was unreadable; rebuilt from its job %s (%s), which is "
            "followed, not submitted again",
            record.id, route.name, found.job_name, found.status,
        )  # fmt: skip
        return record

    def _job_status(self, job_name: str) -> tuple[str, str | None, dict[str, Any]]:
        """The job's status, why it failed when the submitter says, and what it reports of its outcome
        (OUTCOME_KEYS): a job the submitter no longer has (deleted, or never kept) is Failed, as is a local
        run whose runner died, so that nothing waits on it forever."""
        try:
            job = self._submitter.status(job_name)
        except JobNotFound as gone:
            log.warning(
                "job %s is gone (%s); its submission fails and its items return to pending", job_name, gone
            )
            return FAILED, f"the job is gone: {gone}", {}
        reason = job.details.get("reason") if job.status == FAILED else None
        return job.status, reason, _outcome(job.details) if job.status in TERMINAL_STATES else {}

    def _leave_out_rejected(self, record: SubmissionRecord) -> None:
        """The raw files the run's prepare step left out because they do not fit (its REJECTED_KEY): each
        is named once, in one warning line; the claims that brought them end `DROPPED` with the reason, so
        they never return to pending; and the next batch's manifest leaves them out (_previous_manifest).
        The file's newer version, if one lands, comes with its own event."""
        rejected = [item for item in record.details.get(REJECTED_KEY) or () if isinstance(item, Mapping)]
        if not rejected:
            return
        pinned = record.details.get("manifest")
        sources = {file.name: file.source for file in DataManifest.from_json(pinned).files} if pinned else {}
        why: dict[str, str] = {}
        for item in rejected:
            name, reason = str(item.get("name")), str(item.get("reason"))
            source = sources.get(name)
            shown = f"{escaped(name)} ({displayable_url(source)})" if source else escaped(name)
            log.warning(
                "flush %s: submission %s left out raw file %s, which does not fit: %s; no later version "
                "pins it",
                record.model_name, record.id, shown, reason,
            )  # fmt: skip
            if source is not None:
                why[source] = reason
        left_out = [
            claim for claim in self._ledger.claims(record.model_name, tag=record.id) if _source(claim) in why
        ]
        self._ledger.retag(
            left_out,
            lambda event: event.with_decision(REJECTED, f"left out by prep: {why[_blob_url(event)]}"),
            DROPPED,
        )

    def _find_job(self, model: str, raw_version: str | None) -> Any:
        if raw_version is None:
            return None
        try:
            return self._submitter.status(job_name_for(model, raw_version))
        except SubmissionError:
            return None

    def _end(self, model: str, submission_id: str, status: str) -> None:
        """The end of `submission_id`: a failed one's claims return to pending, then the state forgets it."""
        if status != "Completed":
            returned = f"submission {submission_id} ended {status}; carried into the next run"
            self._ledger.retag(
                self._ledger.claims(model, tag=submission_id),
                lambda event: event.with_decision(COALESCED, returned, None),
                PENDING,
            )
        self._finish(model, submission_id, status)

    def _finish(self, model: str, submission_id: str, status: str) -> None:
        state, version = self._ledger.load_state(model)
        new_state = finish_submission(state, submission_id, self._clock(), status=status)
        if new_state is not state and not self._ledger.save_state(model, new_state, version):
            raise LedgerBusyError(f"model {model!r}: its state changed under the flush lease; retry")


def lease_refusal(holder: Holder | None, now: datetime) -> tuple[str, bool]:
    """Why a flush did not take the model's flush lease, naming the holder and its age where it wrote
    them, and whether the lease looks stuck: an infinite lease (no flush takes one), or a lease that can
    outlive its holder held past STUCK_FLUSH_LEASE_SECONDS. A file lock cannot outlive its process, so a
    local holder is never called stuck, however long its run takes."""
    if holder is None:  # freed between the refusal and the look
        return "another flush of this model is running; it submits", False
    if holder.endless:
        return (
            "the model's flush lease is an infinite lease, which no flush takes (a person or a tool took "
            f"it); nothing of this model is flushed until it is broken ({BREAK_LEASE_HELP})",
            True,
        )
    age = holder.age_seconds(now)
    who = holder.who or "an unrecorded holder"
    held = f"held by {who}" + ("" if age is None else f" for {age:.0f} s")
    if not holder.dies_with_holder and age is not None and age > STUCK_FLUSH_LEASE_SECONDS:
        return (
            f"the model's flush lease is {held}, longer than any flush takes "
            f"({STUCK_FLUSH_LEASE_SECONDS} s); if that holder is gone or hung, break the lease "
            f"({BREAK_LEASE_HELP})",
            True,
        )
    return f"another flush of this model is running ({held}); it submits", False


def _item(claim: Claim) -> PendingItem:
    assert claim.record.item is not None  # Ledger.claim refuses a claim without one
    return claim.record.item


def _source(claim: Claim) -> str | None:
    """The blob URL a claim brings (a manifest file's source), if it brings one."""
    blob = _item(claim).blob
    return None if blob is None else blob.url


def _blob_url(event: Any) -> str:
    return event.item.blob.url


def _nothing_left(dropped: tuple[Vanished, ...]) -> str:
    first = dropped[0].line()
    more = f" and {len(dropped) - 1} more" if len(dropped) > 1 else ""
    gone = "every file of the batch is gone or changed since its event"
    return f"nothing left to submit: {gone} ({first}{more})"


def _inputs(manifest: DataManifest | None, items: tuple[PendingItem, ...]) -> tuple[InputPin, ...]:
    """What the submission brings: the batch's new blobs; a request's own folder: every file it pins."""
    if manifest is not None and any(item.data_uri for item in items):
        return InputPin.of_manifest(manifest)
    return tuple(InputPin(blob.url, f"etag:{blob.etag}") for blob in latest_blobs(items))


def _outcome(details: Mapping[str, Any]) -> dict[str, Any]:
    return {key: details[key] for key in OUTCOME_KEYS if key in details}


def _trigger_tags(items: tuple[PendingItem, ...], submission_id: str) -> dict[str, str]:
    kind = batch_kind(items)
    first = next(item for item in items if item.kind == kind)
    return {"kind": kind, "event_id": first.event_id, "submission": submission_id, "events": str(len(items))}
