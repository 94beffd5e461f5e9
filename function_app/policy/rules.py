"""The front door's policy: dedupe, debounce, cooldown and budget, as pure functions of a model's state.

Nothing here reads a clock or storage: the caller passes `now` (timezone-aware) and the state it loaded
from the ledger, and saves the state it gets back with a compare-and-set (function_app/ledger/).

The rules, per model:
- Dedupe: an item whose dedupe key is already pending or in flight is a duplicate (the ledger's
  create-if-absent claim is the durable dedupe; this one guards the state itself).
- Debounce: while the pending batch holds blobs, it waits for a quiet period Q after the last arrival, or at
  most W after the first pending arrival, whichever comes first. A batch of drift alerts and HTTP requests
  only has no burst to wait for and is ready at once.
- One run in flight per model; at least C seconds from one submission's start to the next one's start; at
  most B submissions per UTC day (failed ones count: the budget bounds the cost, and the retries). A
  submission the submitter refused before anything ran (`withdraw_submission`) is not one: it is uncounted.
- Whatever arrives meanwhile is kept pending and joins the next run: nothing is ever dropped.
- `force` (an HTTP request's) skips the cooldown and the debounce wait, never the dedupe, never the one
  run in flight, and never the daily budget: the budget is the cost cap, and repeated forced calls with
  fresh idempotency keys must not get past it. Raise `max_runs_per_day` to allow more.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from components.request import CANCELED, COMPLETED, FAILED, TERMINAL_STATES
from function_app.events.triggers import (
    ACCEPTED,
    COALESCED,
    COOLDOWN,
    DEBOUNCED,
    DUPLICATE,
    KIND_BLOB,
    KIND_DRIFT,
    KIND_HTTP,
    TriggerRequest,
)
from function_app.policy.state import (
    STATE_SCHEMA,
    ModelState,
    PendingBlob,
    PendingItem,
    PolicyError,
    PolicySettings,
    aware,
    time_text,
    utc_day,
)

__all__ = [
    "STATE_SCHEMA",
    "FlushVerdict",
    "ModelState",
    "PendingBlob",
    "PendingItem",
    "PolicyError",
    "PolicySettings",
    "batch_kind",
    "finish_submission",
    "flush_verdict",
    "latest_blobs",
    "on_arrival",
    "start_submission",
    "withdraw_submission",
    "without_future_times",
]

log = logging.getLogger(__name__)

_KIND_PRIORITY = (KIND_HTTP, KIND_DRIFT, KIND_BLOB)  # the most deliberate trigger names a batch


@dataclass(frozen=True)
class FlushVerdict:
    """Whether to submit the pending batch now; if not, why, and when to look again (None: unknown)."""

    submit: bool
    reason: str
    retry_after_seconds: float | None = None


def on_arrival(
    state: ModelState, request: TriggerRequest, now: datetime, settings: PolicySettings
) -> tuple[str, ModelState]:
    """Add an accepted trigger to the pending batch; returns (decision, new state).

    DUPLICATE (state unchanged) when its dedupe key is already pending or in flight. Otherwise it is kept
    pending, and the word says what happens to it: COALESCED while a run is in flight, or while cooling down
    or over the day's budget (an HTTP request is answered COOLDOWN instead: 409/429 with the retry-after of
    `flush_verdict`; it is kept all the same); DEBOUNCED for a blob joining the batch; ACCEPTED for a drift
    alert or HTTP request ready for the next flush.
    """
    now = aware(now, "now")
    if request.model_name != state.model_name:
        raise PolicyError(
            f"request for model {request.model_name!r} applied to the state of {state.model_name!r}; "
            "expected the state of the request's model"
        )
    if state.holds(request.dedupe_key):
        return DUPLICATE, state
    item = PendingItem.from_request(request, now)
    return _arrival_decision(state, item, now, settings), replace(state, pending=(*state.pending, item))


def _arrival_decision(state: ModelState, item: PendingItem, now: datetime, settings: PolicySettings) -> str:
    if state.in_flight_id is not None:
        return COALESCED
    over_budget = state.runs_on(now) >= settings.max_runs_per_day
    if over_budget or (not item.force and _cooldown_left(state, now, settings) > 0):
        return COOLDOWN if item.kind == KIND_HTTP else COALESCED
    return DEBOUNCED if item.kind == KIND_BLOB else ACCEPTED


def _warn_future(what: str, recorded: datetime, now: datetime, counted_as: str) -> None:
    log.warning(
        "%s %s is %.0f s after this instance's clock (%s); is a clock skewed? It counts as %s",
        what,
        recorded.isoformat(),
        (recorded - now).total_seconds(),
        now.isoformat(),
        counted_as,
    )


def without_future_times(state: ModelState, now: datetime) -> ModelState:
    """`state` with its recorded times that lie after `now` set to `now`, each with a warning.

    Another instance whose clock runs ahead records times in the future. Left as they are, they stretch
    every wait measured from them by the skew (a 1 h cooldown from a start 2 days ahead lasts 49 h);
    clamped once, and saved by the flush that clamped them, no wait lasts longer than its configured
    length. Unchanged (the same object) when no time is in the future."""
    now = aware(now, "now")
    changes = {}
    for name in ("last_submission_at", "in_flight_since", "last_finished_at"):
        recorded = getattr(state, name)
        if recorded is not None and recorded > now:
            _warn_future(f"model {state.model_name!r}: {name.replace('_', ' ')}", recorded, now, "now")
            changes[name] = now
    return replace(state, **changes) if changes else state


def _cooldown_left(state: ModelState, now: datetime, settings: PolicySettings) -> float:
    if state.last_submission_at is None:
        return 0.0
    # A start in the future (a skewed clock's, not yet clamped by a flush) counts as now: at most C.
    ends = min(state.last_submission_at, now) + timedelta(seconds=settings.cooldown_seconds)
    return max(0.0, (ends - now).total_seconds())


def _until_next_utc_midnight(now: datetime) -> float:
    midnight = datetime.combine(now.astimezone(UTC).date() + timedelta(days=1), datetime.min.time(), UTC)
    return (midnight - now).total_seconds()


def _debounce_left(state: ModelState, now: datetime, settings: PolicySettings) -> float:
    # An arrival recorded in the future (by an instance whose clock runs ahead) holds nothing back: were it
    # counted from now, each look would restart its wait, and the batch would wait as long as the skew.
    future = [item.arrived_at for item in state.pending if item.arrived_at > now]
    if future:
        what = f"model {state.model_name!r}: {len(future)} pending arrival(s), the latest"
        _warn_future(what, max(future), now, "quiet already")
    arrivals = [item.arrived_at for item in state.pending if item.arrived_at <= now]
    if not arrivals:
        return 0.0
    first, last = min(arrivals), max(arrivals)
    ready_at = min(
        last + timedelta(seconds=settings.quiet_seconds), first + timedelta(seconds=settings.max_wait_seconds)
    )
    return max(0.0, (ready_at - now).total_seconds())


def flush_verdict(
    state: ModelState, now: datetime, settings: PolicySettings, ignore_quiet: bool = False
) -> FlushVerdict:
    """Whether the pending batch should be submitted at `now`.

    No while nothing is pending or a run is in flight (retry_after None: it depends on that run). Otherwise
    every rule that holds the batch back is named and retry_after is the longest of their waits: the budget
    until the next UTC midnight, the cooldown until C after the last submission's start, the debounce until
    the quiet period or the maximum wait ends. A forced item skips the cooldown and the debounce;
    `ignore_quiet` skips the debounce only (an operator's "flush now").
    """
    now = aware(now, "now")
    if not state.pending:
        return FlushVerdict(False, "nothing pending")
    if state.in_flight_id is not None:
        return FlushVerdict(
            False, f"submission {state.in_flight_id} in flight since {time_text(state.in_flight_since)}"
        )
    forced = any(item.force for item in state.pending)
    waits = _waits(state, now, settings, skip_cooldown=forced, skip_debounce=forced or ignore_quiet)
    if waits:
        return FlushVerdict(False, "; ".join(reason for reason, _ in waits), max(left for _, left in waits))
    return FlushVerdict(True, _ready_reason(state, now, settings, forced, ignore_quiet))


def _waits(
    state: ModelState, now: datetime, settings: PolicySettings, *, skip_cooldown: bool, skip_debounce: bool
) -> list[tuple[str, float]]:
    waits = []
    runs, budget = state.runs_on(now), settings.max_runs_per_day
    if runs >= budget:
        waits.append(
            (f"daily budget spent ({runs} of {budget} runs today, UTC)", _until_next_utc_midnight(now))
        )
    cooldown = 0.0 if skip_cooldown else _cooldown_left(state, now, settings)
    if cooldown > 0:
        gap = settings.cooldown_seconds
        waits.append((f"cooling down for {cooldown:.0f} s more ({gap:g} s between runs)", cooldown))
    has_blobs = any(item.kind == KIND_BLOB for item in state.pending)
    debounce = 0.0 if skip_debounce or not has_blobs else _debounce_left(state, now, settings)
    if debounce > 0:
        waits.append((f"debouncing uploads for {debounce:.0f} s more", debounce))
    return waits


def _ready_reason(
    state: ModelState, now: datetime, settings: PolicySettings, forced: bool, ignore_quiet: bool
) -> str:
    count = len(state.pending)
    if forced:
        return f"forced by a request; {count} pending item(s)"
    if ignore_quiet:
        return f"flush requested; {count} pending item(s)"
    if not any(item.kind == KIND_BLOB for item in state.pending):
        return f"{count} request(s) ready"
    last = max(item.arrived_at for item in state.pending)
    if now - last >= timedelta(seconds=settings.quiet_seconds):
        return f"quiet for {settings.quiet_seconds:g} s; {count} pending item(s)"
    return f"maximum wait of {settings.max_wait_seconds:g} s reached; {count} pending item(s)"


def start_submission(
    state: ModelState, submission_id: str, now: datetime, raw_version: str | None = None
) -> tuple[ModelState, tuple[PendingItem, ...]]:
    """Move every pending item into the in-flight submission `submission_id`, started at `now`, on the raw
    data version `raw_version` (None: no data yet, or a registered asset's).

    Counts the run in the day's budget and starts the cooldown. The caller saves the new state (compare-and-
    set) before it submits: the state that won the race is the one that submits. Refuses a second run in
    flight, and an empty batch.
    """
    now = aware(now, "now")
    if state.in_flight_id is not None:
        raise PolicyError(
            f"model {state.model_name!r} already has submission {state.in_flight_id} in flight; "
            "expected one run in flight per model (finish it first)"
        )
    if not state.pending:
        raise PolicyError(f"model {state.model_name!r} has nothing pending; expected items to submit")
    items = tuple(sorted(state.pending, key=lambda item: item.arrived_at))
    day = utc_day(now)
    new_state = replace(
        state,
        pending=(),
        in_flight_id=submission_id,
        in_flight_since=now,
        in_flight_items=items,
        in_flight_kind=batch_kind(items),
        in_flight_raw_version=raw_version,
        last_submission_at=now,
        runs_day=day,
        runs_today=state.runs_on(now) + 1,
    )
    return new_state, items


def finish_submission(
    state: ModelState, submission_id: str, now: datetime, *, status: str = COMPLETED
) -> ModelState:
    """End the in-flight submission `submission_id` with its terminal `status` (the submitter's word).

    Completed: its items are done. Failed or Canceled: its items go back to pending, ahead of newer ones
    and with their first arrival times, so the next flush retries them (nothing is dropped; the budget
    bounds the retries of a pipeline that keeps failing). This is also how a stale in-flight submission is
    cleared: when the process died after `start_submission`, the service asks the submitter for the job's
    status (a job that never reached it counts as Failed) and finishes it here.

    Idempotent: finishing a submission that is not the one in flight (already finished, or never started
    here) returns `state` unchanged.
    """
    now = aware(now, "now")
    if status not in TERMINAL_STATES:
        raise PolicyError(
            f"submission status {status!r}: expected a terminal one of {sorted(TERMINAL_STATES)}"
        )
    if state.in_flight_id != submission_id:
        return state
    retried = state.in_flight_items if status in (FAILED, CANCELED) else ()
    return replace(
        state,
        pending=(*retried, *state.pending),
        in_flight_id=None,
        in_flight_since=None,
        in_flight_items=(),
        in_flight_kind=None,
        in_flight_raw_version=None,
        last_finished_id=submission_id,
        last_finished_at=now,
        last_outcome=status,
    )


def withdraw_submission(
    state: ModelState, submission_id: str, last_submission_at: datetime | None
) -> ModelState:
    """Undo `start_submission` of `submission_id`, which its submitter refused before anything ran (its
    pre-run check): its items go back to pending, it is no longer counted in its day's budget, and the
    cooldown counts from `last_submission_at`, the start of the submission before it.

    Idempotent: withdrawing a submission that is not the one in flight returns `state` unchanged.
    """
    if state.in_flight_id != submission_id:
        return state
    if last_submission_at is not None:
        last_submission_at = aware(last_submission_at, "last_submission_at")
    counted = state.in_flight_since is not None and state.runs_day == utc_day(state.in_flight_since)
    return replace(
        state,
        pending=(*state.in_flight_items, *state.pending),
        in_flight_id=None,
        in_flight_since=None,
        in_flight_items=(),
        in_flight_kind=None,
        in_flight_raw_version=None,
        last_submission_at=last_submission_at,
        runs_today=max(state.runs_today - 1, 0) if counted else state.runs_today,
    )


def latest_blobs(items: Iterable[PendingItem]) -> tuple[PendingBlob, ...]:
    """The newest version of each blob among `items`, by Event Grid's sequencer (string order is event
    order for one blob name), sorted by URL: what a batch's data manifest should pin."""
    newest: dict[str, PendingBlob] = {}
    for item in items:
        blob = item.blob
        if blob is not None and (blob.url not in newest or blob.sequencer > newest[blob.url].sequencer):
            newest[blob.url] = blob
    return tuple(newest[url] for url in sorted(newest))


def batch_kind(items: Iterable[PendingItem]) -> str:
    """The kind a submission is recorded under: http if a person asked, else drift, else blob."""
    kinds = {item.kind for item in items}
    for kind in _KIND_PRIORITY:
        if kind in kinds:
            return kind
    raise PolicyError("an empty batch has no kind; expected at least one item")
