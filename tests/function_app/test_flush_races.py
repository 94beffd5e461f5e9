"""Flushes racing, and flushes killed: every blob rides in exactly one submission that completes, the daily
budget counts each submission once, and no record is left `Submitting`.

Each trial gets its own ledger (a local folder, or a prefix in an Azurite container) holding a batch of
blob claims; 2, then 4, processes flush it `--now` at once, ten trials each. Then a flush is SIGKILLed at
each durable step between the batch's claim and the job's record, and another flush recovers it."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers.function_app.corpus import EVENT_GRID, PREFIX, blob_created, blob_url
from helpers.function_app.flush_harness import (
    JobBoard,
    flush_in_trials,
    front_door,
    run_to_death,
    run_together,
)
from helpers.function_app.front_door_settings import app_settings

from function_app.flush import HELD_STEP, STEPS
from function_app.ledger.ledger import open_ledger
from function_app.ledger.records import SUBMITTING

TRIALS, BLOBS = 10, 6


def _deliver_batch(environ: dict[str, str], board: Path, trial: int) -> list[str]:
    """Blob-created events for BLOBS new blobs (one delivered twice); the blobs' URLs."""
    door = front_door(environ, board)
    names = [f"{PREFIX}/t{trial}-{n}.csv" for n in range(BLOBS)]
    for name in [*names, names[0]]:
        outcome = door.deliver(blob_created(EVENT_GRID, name, eTag=f"0x{trial:04X}{len(name):04X}"), "blob")
        assert outcome.decision in ("debounced", "duplicate")
    return [blob_url(name) for name in names]


def _check_exactly_once(environ: dict[str, str], board: Path, urls: list[str]) -> None:
    ledger = open_ledger(environ["RETRAIN_LEDGER"], environ.get("RETRAIN_STORAGE_CONNECTION_STRING"))
    submissions = ledger.snapshot()["submissions"]
    assert [s["status"] for s in submissions if s["status"] == SUBMITTING] == []
    completed = [s for s in submissions if s["status"] == "Completed"]
    carried = Counter(url for s in completed for url in s["inputs"])
    assert carried == Counter(urls), "each blob in exactly one submission that completes"
    state, _ = ledger.load_state("digits")
    assert state.runs_on(datetime.now(UTC)) == len(submissions)  # the budget counts each submission once
    assert state.in_flight_id is None and ledger.claims("digits") == []
    jobs = JobBoard(board).jobs()
    assert sorted(job["job_name"] for job in jobs) == sorted(s["job_name"] for s in completed)


def _trials(tmp_path: Path, ledger_of) -> list[tuple[dict[str, str], str, list[str]]]:
    trials = []
    for trial in range(TRIALS):
        environ = app_settings(tmp_path / f"home-{trial}", **ledger_of(trial))
        board = tmp_path / f"board-{trial}"
        trials.append((environ, str(board), _deliver_batch(environ, board, trial)))
    return trials


def _race(trials, workers: int) -> None:
    outcomes = run_together(
        flush_in_trials, [([(e, b) for e, b, _ in trials], w) for w in range(workers)], TRIALS
    )
    errors = [ids for _, _, ids in outcomes if any(i.startswith("error") for i in ids)]
    assert errors == []
    per_trial = Counter(trial for trial, _, ids in outcomes for _ in ids)
    assert all(per_trial[trial] == 1 for trial in range(TRIALS)), per_trial  # one flush submitted each batch
    for environ, board, urls in trials:
        _check_exactly_once(environ, Path(board), urls)


@pytest.mark.parametrize("workers", [2, 4])
def test_concurrent_flushes_on_a_local_ledger_submit_each_blob_once(tmp_path, workers):
    _race(_trials(tmp_path, lambda trial: {}), workers)


@pytest.mark.parametrize("workers", [2, 4])
def test_concurrent_flushes_on_azurite_submit_each_blob_once(tmp_path, azurite, workers):
    container = f"races-{workers}"
    azurite.service_client().create_container(container)
    on_azurite = lambda trial: {  # noqa: E731 -- one ledger prefix per trial
        "RETRAIN_LEDGER": f"{azurite.blob_endpoint}/{container}/trial-{trial}",
        "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string,
    }
    _race(_trials(tmp_path, on_azurite), workers)


@pytest.mark.parametrize("step", STEPS)
def test_a_flush_killed_at_each_step_is_recovered_once_by_the_next(tmp_path, step):
    environ = app_settings(tmp_path / "home")
    board = tmp_path / "board"
    urls = _deliver_batch(environ, board, 0)

    assert run_to_death(environ, str(board), step) == -9
    ledger = open_ledger(environ["RETRAIN_LEDGER"])
    state, _ = ledger.load_state("digits")
    assert state.in_flight_id is not None  # the dead flush left its batch in flight

    door = front_door(environ, board)
    door.flush(ignore_quiet=True)  # recovers the dead flush's submission, then submits what is pending
    door.flush(ignore_quiet=True)  # nothing is left to do
    _check_exactly_once(environ, board, urls)
    [dead] = [s for s in ledger.snapshot()["submissions"] if s["id"] == state.in_flight_id]
    # A flush killed after the submitter accepted the job: adopted; earlier: failed, its blobs resubmitted.
    assert dead["status"] == ("Completed" if step == "submitted" else "Failed")


def test_a_flush_killed_while_holding_a_refused_run_is_finished_by_the_next_and_spends_no_budget(tmp_path):
    environ = app_settings(tmp_path / "home")
    board = tmp_path / "board"
    urls = _deliver_batch(environ, board, 0)
    refusal = "preflight: primary_metric names metric 'recall_99', which the task does not report"

    # The submitter's pre-run check refuses the run; the flush dies once the record says held.
    assert run_to_death(environ, str(board), HELD_STEP, refuse=refusal) == -9
    ledger = open_ledger(environ["RETRAIN_LEDGER"])
    state, _ = ledger.load_state("digits")
    assert state.in_flight_id is not None and state.runs_today == 1  # counted, for now
    held_id = state.in_flight_id

    # The next flush finishes withdrawing it, then tries the batch again: refused again, held again.
    door = front_door(environ, board, refuse=refusal)
    assert door.flush(ignore_quiet=True) == []
    state, _ = ledger.load_state("digits")
    assert (state.in_flight_id, state.runs_today, state.last_submission_at) == (None, 0, None)
    assert door.verdicts()["digits"].reason == f"held: {refusal}"
    pending = ledger.claims("digits")
    assert sorted(claim.record.item.blob.url for claim in pending) == sorted(urls)
    assert {claim.record.reason for claim in pending} == {f"held: {refusal}"}
    records = ledger.snapshot()["submissions"]
    assert [s["status"] for s in records] == ["Failed", "Failed"]  # two refused, neither ran
    assert records[0]["id"] == held_id and records[0]["details"]["reason"] == f"held: {refusal}"

    # Fixed, the batch goes: one run counted, every blob in it once.
    [submitted] = front_door(environ, board).flush(ignore_quiet=True)
    assert submitted.status == "Completed"
    assert sorted(pin.url for pin in submitted.inputs) == sorted(urls)
    state, _ = ledger.load_state("digits")
    assert state.runs_today == 1 and state.in_flight_id is None and ledger.claims("digits") == []
    assert len(JobBoard(board).jobs()) == 1
