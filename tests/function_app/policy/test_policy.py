"""The policy, pure: dedupe, debounce (quiet period and maximum wait), cooldown, daily budget, one run in
flight, coalescing, force, and nothing ever dropped. Q=60 s, W=300 s, C=600 s, B=3 runs a day."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from helpers.function_app.ledger_harness import (
    MODEL,
    SETTINGS,
    T0,
    blob_request,
    blob_url,
    drift_request,
    http_request,
)

from components.request import CANCELED, COMPLETED, FAILED, RUNNING
from function_app.events.triggers import (
    ACCEPTED,
    COALESCED,
    COOLDOWN,
    DEBOUNCED,
    DUPLICATE,
    KIND_DRIFT,
    KIND_HTTP,
)
from function_app.policy.rules import (
    ModelState,
    PendingItem,
    PolicyError,
    PolicySettings,
    batch_kind,
    finish_submission,
    flush_verdict,
    latest_blobs,
    on_arrival,
    start_submission,
    withdraw_submission,
    without_future_times,
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def arrive(state: ModelState, *requests_at: tuple[object, float]) -> tuple[list[str], ModelState]:
    decisions = []
    for request, seconds in requests_at:
        decision, state = on_arrival(state, request, at(seconds), SETTINGS)
        decisions.append(decision)
    return decisions, state


def submitted_at(seconds: float, state: ModelState | None = None, sid: str = "sub-1") -> ModelState:
    """A state whose run `sid` started at T0+seconds (and is still in flight)."""
    state = state or ModelState.empty(MODEL)
    _, state = arrive(state, (drift_request(f"start-{sid}"), seconds))
    state, _ = start_submission(state, sid, at(seconds))
    return state


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"quiet_seconds": -1}, "quiet_seconds"),
        ({"max_wait_seconds": float("inf")}, "max_wait_seconds"),
        ({"cooldown_seconds": True}, "cooldown_seconds"),
        ({"quiet_seconds": 400}, "max_wait_seconds 300 is below quiet_seconds 400"),
        ({"max_runs_per_day": 0}, "max_runs_per_day"),
        ({"max_runs_per_day": 2.5}, "max_runs_per_day"),
    ],
)
def test_settings_refuse_bad_values_naming_them(values, named):
    fields = {"quiet_seconds": 60, "max_wait_seconds": 300, "cooldown_seconds": 600, "max_runs_per_day": 3}
    with pytest.raises(PolicyError, match="expected") as caught:
        PolicySettings(**{**fields, **values})
    assert named in str(caught.value)
    assert "\n" not in str(caught.value)


def test_first_arrivals_are_debounced_blobs_and_accepted_requests():
    decisions, state = arrive(
        ModelState.empty(MODEL),
        (blob_request("a.csv"), 0),
        (drift_request("run-1"), 1),
        (http_request("k1"), 2),
    )
    assert decisions == [DEBOUNCED, ACCEPTED, ACCEPTED]
    assert [item.kind for item in state.pending] == ["blob", "drift", "http"]
    assert state.pending[0].blob is not None and state.pending[0].blob.url == blob_url("a.csv")
    assert state.first_pending_at == at(0) and state.last_arrival_at == at(2)


def test_a_key_already_pending_or_in_flight_is_a_duplicate_and_changes_nothing():
    _, state = arrive(ModelState.empty(MODEL), (blob_request("a.csv"), 0))
    decision, same = on_arrival(state, blob_request("a.csv", now=at(5)), at(5), SETTINGS)
    assert decision == DUPLICATE and same is state
    state, _ = start_submission(state, "sub-1", at(70))
    decision, same = on_arrival(state, blob_request("a.csv"), at(80), SETTINGS)
    assert decision == DUPLICATE and same is state
    # Another version (eTag) of the same blob is new data, not a duplicate.
    decision, newer = on_arrival(state, blob_request("a.csv", etag="0x8DC2"), at(80), SETTINGS)
    assert decision == COALESCED and len(newer.pending) == 1


def test_a_burst_waits_for_the_quiet_period_after_its_last_upload():
    _, state = arrive(
        ModelState.empty(MODEL),
        (blob_request("a.csv"), 0),
        (blob_request("b.csv"), 50),
        (blob_request("c.csv"), 100),
    )
    waiting = flush_verdict(state, at(120), SETTINGS)
    assert not waiting.submit and waiting.retry_after_seconds == pytest.approx(40)
    assert "debouncing" in waiting.reason
    ready = flush_verdict(state, at(160), SETTINGS)
    assert ready.submit and "quiet for 60 s" in ready.reason and ready.retry_after_seconds is None


def test_an_endless_burst_is_cut_at_the_maximum_wait_from_its_first_upload():
    state = ModelState.empty(MODEL)
    for index, seconds in enumerate(range(0, 300, 50)):  # an upload every 50 s: never quiet for 60 s
        _, state = arrive(state, (blob_request(f"{index}.csv"), seconds))
    waiting = flush_verdict(state, at(280), SETTINGS)
    assert not waiting.submit and waiting.retry_after_seconds == pytest.approx(20)  # W ends before Q
    ready = flush_verdict(state, at(300), SETTINGS)
    assert ready.submit and "maximum wait of 300 s" in ready.reason


def test_requests_alone_are_ready_at_once_but_wait_with_a_burst_they_join():
    _, requests_only = arrive(ModelState.empty(MODEL), (drift_request("run-1"), 0), (http_request("k1"), 1))
    assert flush_verdict(requests_only, at(1), SETTINGS).submit
    _, mixed = arrive(ModelState.empty(MODEL), (blob_request("a.csv"), 0), (drift_request("run-1"), 10))
    assert not flush_verdict(mixed, at(10), SETTINGS).submit
    assert flush_verdict(mixed, at(70), SETTINGS).submit
    assert flush_verdict(mixed, at(10), SETTINGS, ignore_quiet=True).submit


def test_nothing_pending_is_never_submitted():
    verdict = flush_verdict(ModelState.empty(MODEL), at(0), SETTINGS, ignore_quiet=True)
    assert not verdict.submit and verdict.reason == "nothing pending" and verdict.retry_after_seconds is None


def test_arrivals_during_a_run_in_flight_are_coalesced_and_wait_for_it():
    state = submitted_at(0)
    decisions, state = arrive(
        state, (blob_request("a.csv"), 10), (drift_request("run-2"), 20), (http_request("k1", force=True), 30)
    )
    assert decisions == [COALESCED, COALESCED, COALESCED]
    verdict = flush_verdict(state, at(5000), SETTINGS, ignore_quiet=True)
    assert not verdict.submit and "sub-1 in flight" in verdict.reason and verdict.retry_after_seconds is None
    with pytest.raises(PolicyError, match="one run in flight per model"):
        start_submission(state, "sub-2", at(5000))


def test_cooldown_runs_from_one_submission_start_to_the_next_not_from_the_finish():
    state = finish_submission(submitted_at(0), "sub-1", at(500))
    decision, state = on_arrival(state, drift_request("run-2"), at(550), SETTINGS)
    assert decision == COALESCED
    waiting = flush_verdict(state, at(560), SETTINGS)
    assert not waiting.submit and "cooling down" in waiting.reason
    assert waiting.retry_after_seconds == pytest.approx(40)
    assert flush_verdict(state, at(600), SETTINGS).submit


def test_a_start_recorded_by_a_clock_running_ahead_cools_down_no_longer_than_configured(caplog):
    skew = timedelta(days=2)  # another instance's clock runs 2 days ahead: it recorded its run's start
    state = finish_submission(submitted_at(skew.total_seconds()), "sub-1", at(skew.total_seconds() + 5))
    _, state = on_arrival(state, drift_request("run-2"), at(10), SETTINGS)
    assert flush_verdict(state, at(10), SETTINGS).retry_after_seconds == pytest.approx(600)  # not 173,390

    settled = without_future_times(state, at(10))  # what a flush saves, once

    assert settled.last_submission_at == settled.last_finished_at == at(10)
    assert (
        "last submission at 2026-12-01T10:00:00+00:00 is 172790 s after this instance's clock" in caplog.text
    )
    assert flush_verdict(settled, at(609), SETTINGS).retry_after_seconds == pytest.approx(1)
    assert flush_verdict(settled, at(610), SETTINGS).submit
    assert without_future_times(settled, at(10)) is settled


def test_arrivals_recorded_by_a_clock_running_ahead_hold_the_batch_back_no_longer_than_configured():
    ahead = T0 + timedelta(days=2)
    _, state = on_arrival(ModelState.empty(MODEL), blob_request("a.csv", now=ahead), ahead, SETTINGS)
    assert flush_verdict(state, at(0), SETTINGS).submit  # not held back for 2 days and 60 s

    _, state = on_arrival(state, blob_request("b.csv", now=at(0)), at(0), SETTINGS)

    assert flush_verdict(state, at(0), SETTINGS).retry_after_seconds == pytest.approx(60)
    assert flush_verdict(state, at(60), SETTINGS).submit


def test_an_http_request_while_cooling_down_is_answered_cooldown_and_still_kept():
    state = finish_submission(submitted_at(0), "sub-1", at(100))
    decision, state = on_arrival(state, http_request("k1"), at(200), SETTINGS)
    assert decision == COOLDOWN
    assert [item.dedupe_key for item in state.pending] == ["http:k1"]
    verdict = flush_verdict(state, at(200), SETTINGS)
    assert verdict.retry_after_seconds == pytest.approx(400)  # the Retry-After of its 409/429
    assert flush_verdict(state, at(600), SETTINGS).submit  # and it rides in the next run


def test_force_skips_cooldown_and_debounce_but_not_dedupe_or_the_run_in_flight():
    state = finish_submission(submitted_at(0), "sub-1", at(100))
    _, state = arrive(state, (blob_request("a.csv"), 200))
    decision, state = on_arrival(state, http_request("k1", force=True), at(201), SETTINGS)
    assert decision == ACCEPTED
    verdict = flush_verdict(state, at(201), SETTINGS)
    assert verdict.submit and verdict.reason.startswith("forced")
    assert on_arrival(state, http_request("k1", force=True), at(202), SETTINGS)[0] == DUPLICATE
    in_flight, _ = start_submission(state, "sub-2", at(203))
    assert on_arrival(in_flight, http_request("k2", force=True), at(204), SETTINGS)[0] == COALESCED


def test_a_forced_request_held_by_a_run_in_flight_goes_as_soon_as_that_run_finishes():
    _, state = arrive(submitted_at(0), (http_request("k1", force=True), 10))
    state = finish_submission(state, "sub-1", at(20))
    verdict = flush_verdict(state, at(20), SETTINGS)  # well within the cooldown
    assert verdict.submit and verdict.reason.startswith("forced")


def run_day(runs: int, step_s: float = 600) -> ModelState:
    state = ModelState.empty(MODEL)
    for index in range(runs):
        state = submitted_at(index * step_s, state, sid=f"sub-{index}")
        state = finish_submission(state, f"sub-{index}", at(index * step_s + 60))
    return state


def test_the_daily_budget_holds_until_the_next_utc_midnight_even_for_force():
    state = run_day(3)  # 10:00, 10:10, 10:20 UTC
    assert state.runs_on(at(1800)) == 3
    decision, state = on_arrival(state, http_request("k1", force=True), at(1800), SETTINGS)
    assert decision == COOLDOWN
    verdict = flush_verdict(state, at(1800), SETTINGS)
    until_midnight = (datetime(2026, 11, 30, tzinfo=UTC) - at(1800)).total_seconds()
    assert not verdict.submit and "daily budget spent (3 of 3" in verdict.reason
    assert verdict.retry_after_seconds == pytest.approx(until_midnight)
    assert flush_verdict(state, datetime(2026, 11, 30, 0, 0, 1, tzinfo=UTC), SETTINGS).submit


def test_the_budget_counts_utc_days_whatever_the_clock_s_time_zone():
    state = run_day(3)
    # 02:00 at +05:00 on the 30th is 21:00 UTC on the 29th: still the spent day.
    late_evening = datetime(2026, 11, 30, 2, 0, tzinfo=timezone(timedelta(hours=5)))
    assert state.runs_on(late_evening) == 3
    _, state = arrive(state, (drift_request("run-9"), 0))
    assert not flush_verdict(state, late_evening, SETTINGS).submit
    next_day = datetime(2026, 11, 30, 0, 30, tzinfo=UTC)
    state, _ = start_submission(state, "sub-next", next_day)
    assert (state.runs_day, state.runs_today) == ("2026-11-30", 1)


def test_a_blob_over_budget_is_coalesced_not_refused():
    decision, state = on_arrival(run_day(3), blob_request("late.csv"), at(1800), SETTINGS)
    assert decision == COALESCED and len(state.pending) == 1


def test_start_moves_every_pending_item_in_arrival_order_and_counts_the_run():
    _, state = arrive(ModelState.empty(MODEL), (blob_request("b.csv"), 5), (blob_request("a.csv"), 1))
    state = replace(state, pending=tuple(reversed(state.pending)))  # stored order does not matter
    started, items = start_submission(state, "sub-1", at(100))
    assert [item.blob.url for item in items if item.blob] == [blob_url("a.csv"), blob_url("b.csv")]
    assert [item.arrived_at for item in items] == [at(1), at(5)]
    assert started.pending == () and started.in_flight_items == items
    assert (started.in_flight_id, started.in_flight_since, started.last_submission_at) == (
        "sub-1",
        at(100),
        at(100),
    )
    assert started.runs_today == 1
    with pytest.raises(PolicyError, match="nothing pending"):
        start_submission(ModelState.empty(MODEL), "sub-2", at(100))


def test_a_failed_or_canceled_run_puts_its_items_back_first_with_their_arrival_times():
    for status in (FAILED, CANCELED):
        _, state = arrive(ModelState.empty(MODEL), (blob_request("a.csv"), 0))
        state, items = start_submission(state, "sub-1", at(60))
        _, state = arrive(state, (blob_request("b.csv"), 70))
        state = finish_submission(state, "sub-1", at(90), status=status)
        assert [item.dedupe_key for item in state.pending] == [
            items[0].dedupe_key,
            blob_request("b.csv").dedupe_key,
        ]
        assert state.pending[0].arrived_at == at(0)
        assert (state.in_flight_id, state.last_outcome, state.last_finished_id) == (None, status, "sub-1")


def test_a_completed_run_is_done_and_finishing_is_idempotent():
    state = submitted_at(0)
    done = finish_submission(state, "sub-1", at(100), status=COMPLETED)
    assert done.pending == () and done.in_flight_id is None and done.last_outcome == COMPLETED
    assert finish_submission(done, "sub-1", at(200), status=FAILED) is done  # already finished
    assert finish_submission(state, "someone-else", at(100)) is state
    with pytest.raises(PolicyError, match="terminal"):
        finish_submission(state, "sub-1", at(100), status=RUNNING)


def test_a_withdrawn_submission_never_happened_for_the_budget_or_the_cooldown():
    state = submitted_at(0)  # the run before, finished
    state = finish_submission(state, "sub-1", at(100), status=COMPLETED)
    _, state = arrive(state, (drift_request("run-2"), 200))
    started, items = start_submission(state, "sub-2", at(4000))  # its submitter then refuses it

    withdrawn = withdraw_submission(started, "sub-2", state.last_submission_at)

    assert [item.dedupe_key for item in withdrawn.pending] == [item.dedupe_key for item in items]
    assert withdrawn.in_flight_id is None and withdrawn.in_flight_raw_version is None
    assert (withdrawn.runs_today, withdrawn.last_submission_at) == (1, at(0))  # as before it started
    assert (withdrawn.last_finished_id, withdrawn.last_outcome) == ("sub-1", COMPLETED)  # no run ended
    assert withdraw_submission(withdrawn, "sub-2", at(0)) is withdrawn  # idempotent
    assert flush_verdict(withdrawn, at(4000), SETTINGS).submit  # no cooldown from the withdrawn one


def test_a_stale_in_flight_run_reconciled_as_failed_is_retried_after_the_cooldown():
    _, state = arrive(ModelState.empty(MODEL), (drift_request("run-1"), 0))
    state, _ = start_submission(state, "sub-lost", at(0))  # the process died before submitting
    state = finish_submission(state, "sub-lost", at(3600), status=FAILED)  # the service's reconciliation
    verdict = flush_verdict(state, at(3600), SETTINGS)
    assert verdict.submit
    retried, items = start_submission(state, "sub-again", at(3600))
    assert [item.dedupe_key for item in items] == ["drift:run-1"] and retried.runs_today == 2


def fresh_request(generator: random.Random, step: int) -> object:
    choices = [
        blob_request(f"{step % 40}.csv", etag=f"0x{step}"),
        drift_request(f"run-{step}"),
        http_request(f"k{step}", force=generator.random() < 0.2),
    ]
    return generator.choice(choices)


def test_nothing_is_ever_dropped_whatever_the_interleaving():
    generator = random.Random(20261129)
    state, now = ModelState.empty(MODEL), T0
    sent, accepted, completed, runs = [], [], [], 0
    for step in range(1500):
        now += timedelta(seconds=generator.choice([1, 5, 30, 90, 400, 3600]))
        action = generator.random()
        if action < 0.55:
            redelivery = sent and generator.random() < 0.3  # Event Grid delivers at least once
            request = generator.choice(sent) if redelivery else fresh_request(generator, step)
            sent.append(request)
            decision, state = on_arrival(state, request, now, SETTINGS)
            if decision != DUPLICATE:
                accepted.append(request.dedupe_key)
        elif state.in_flight_id is None and flush_verdict(state, now, SETTINGS).submit:
            runs += 1
            state, _ = start_submission(state, f"sub-{runs}", now)
        elif state.in_flight_id is not None:
            outcome = generator.choice([COMPLETED, COMPLETED, FAILED, CANCELED])
            items = state.in_flight_items
            state = finish_submission(state, state.in_flight_id, now, status=outcome)
            if outcome == COMPLETED:
                completed.extend(item.dedupe_key for item in items)
        state = ModelState.from_dict(json.loads(json.dumps(state.to_dict())))  # as the ledger stores it
    remaining = [item.dedupe_key for item in (*state.pending, *state.in_flight_items)]
    assert runs > 25 and len(completed) > 100 and len(accepted) < len(sent)
    # Each accepted item was completed exactly once or is still held (a re-delivery after completion is
    # new to the state; the ledger's claim is what refuses it in the service).
    assert sorted(completed + remaining) == sorted(accepted)


def test_the_state_round_trips_through_json():
    _, state = arrive(ModelState.empty(MODEL), (blob_request("a.csv"), 0), (http_request("k", force=True), 1))
    state, _ = start_submission(state, "sub-1", at(2))
    _, state = arrive(state, (drift_request("run-1"), 3))
    assert ModelState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda data: {**data, "schema": 99}, "schema 99"),
        (lambda data: {k: v for k, v in data.items() if k != "pending"}, "missing or mistyped 'pending'"),
        (lambda data: {**data, "runs_today": -1}, "runs_today -1"),
        (lambda data: {**data, "runs_day": "29/11/2026"}, "runs_day"),
        (lambda data: {**data, "in_flight_since": "2026-11-29T10:00:00"}, "in_flight_since"),
        (
            lambda data: {**data, "pending": [*data["pending"], data["pending"][0]]},
            "dedupe key appears twice",
        ),
        (lambda data: {**data, "model_name": "Digits!"}, "model name 'Digits!'"),
    ],
)
def test_a_malformed_stored_state_is_refused_with_a_one_line_reason(mutate, message):
    _, state = arrive(ModelState.empty(MODEL), (blob_request("a.csv"), 0))
    with pytest.raises(PolicyError, match="expected") as caught:
        ModelState.from_dict(mutate(state.to_dict()))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_inputs_of_the_wrong_model_or_without_a_time_zone_are_refused():
    with pytest.raises(PolicyError, match="expected the state of the request's model"):
        on_arrival(ModelState.empty("other"), drift_request("run-1"), at(0), SETTINGS)
    with pytest.raises(PolicyError, match="timezone-aware"):
        on_arrival(ModelState.empty(MODEL), drift_request("run-1"), datetime(2026, 11, 29, 10), SETTINGS)
    with pytest.raises(PolicyError, match="expected a blob exactly when"):
        PendingItem("e", "k", KIND_DRIFT, at(0), blob=PendingItem.from_request(blob_request("a"), at(0)).blob)


def test_a_batch_pins_the_newest_version_of_each_blob_and_is_named_by_its_most_deliberate_trigger():
    older = blob_request("a.csv", etag="0x1", sequencer="0000000000000000000000000000000a")
    newer = blob_request("a.csv", etag="0x2", sequencer="0000000000000000000000000000000b")
    _, state = arrive(ModelState.empty(MODEL), (newer, 0), (older, 1), (blob_request("b.csv"), 2))
    assert [(blob.url, blob.etag) for blob in latest_blobs(state.pending)] == [
        (blob_url("a.csv"), "0x2"),
        (blob_url("b.csv"), "0x8DC1"),
    ]
    assert batch_kind(state.pending) == "blob"
    _, state = arrive(state, (drift_request("run-1"), 3))
    assert batch_kind(state.pending) == KIND_DRIFT
    _, state = arrive(state, (http_request("k"), 4))
    assert batch_kind(state.pending) == KIND_HTTP
