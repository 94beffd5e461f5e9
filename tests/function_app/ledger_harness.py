"""Helpers for the policy and ledger tests: trigger requests as the parsers build them, the service's
load -> on_arrival -> save retry loop, and entry points for the multi-process races (run under `spawn`,
so they live in an importable module, not in a test file)."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from function_app.events.triggers import ACCEPTED, KIND_BLOB, KIND_DRIFT, KIND_HTTP, BlobRef, TriggerRequest
from function_app.ledger.local import EventRecord, Ledger, LocalLedger
from function_app.policy.rules import PolicySettings, on_arrival

MODEL = "digits"
ACCOUNT = "retrainlanding"
CONTAINER = "landing"
T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
SETTINGS = PolicySettings(quiet_seconds=60, max_wait_seconds=300, cooldown_seconds=600, max_runs_per_day=3)
BARRIER_TIMEOUT_S = 30.0
CLAIM_ROUNDS = 20


def blob_url(name: str) -> str:
    return f"https://{ACCOUNT}.blob.core.windows.net/{CONTAINER}/incoming/{name}"


def blob_request(
    name: str, etag: str = "0x8DC1", sequencer: str = "00000000000000000000000000000001", now: datetime = T0
) -> TriggerRequest:
    blob = BlobRef(
        url=blob_url(name),
        account=ACCOUNT,
        container=CONTAINER,
        name=f"incoming/{name}",
        etag=etag,
        sequencer=sequencer,
        size=1024,
    )
    return TriggerRequest(
        kind=KIND_BLOB,
        event_id=f"evt-{name}-{etag}",
        dedupe_key=blob.identity,
        model_name=MODEL,
        received_at=now,
        blob=blob,
    )


def drift_request(run_id: str, now: datetime = T0) -> TriggerRequest:
    return TriggerRequest(
        kind=KIND_DRIFT,
        event_id=f"evt-{run_id}",
        dedupe_key=f"drift:{run_id}",
        model_name=MODEL,
        received_at=now,
        reason="feature drift above threshold",
    )


def http_request(key: str, now: datetime = T0, force: bool = False) -> TriggerRequest:
    return TriggerRequest(
        kind=KIND_HTTP,
        event_id=f"req-{key}",
        dedupe_key=f"http:{key}",
        model_name=MODEL,
        received_at=now,
        reason="asked by an operator",
        force=force,
    )


def add_with_retries(ledger: Ledger, request: TriggerRequest, now: datetime = T0) -> int:
    """The service's compare-and-set loop: load, apply, save; again on a lost race. Returns the attempts."""
    attempts = 0
    while True:
        attempts += 1
        state, token = ledger.load_state(request.model_name)
        _, new_state = on_arrival(state, request, now, SETTINGS)
        if ledger.save_state(request.model_name, new_state, token):
            return attempts


def claim_in_process(folder: str, worker: int, barrier: Any, results: Any) -> None:
    """One process's claims of the shared events 'drift:shared-<n>' (n < CLAIM_ROUNDS), in a row, started
    together with the other processes."""
    ledger = LocalLedger(Path(folder))
    reason = f"claimed by process {worker}"
    records = [EventRecord.claim(drift_request(f"shared-{n}"), ACCEPTED, reason) for n in range(CLAIM_ROUNDS)]
    barrier.wait(BARRIER_TIMEOUT_S)
    results.put((worker, [ledger.claim_event(record) for record in records]))


def add_in_process(folder: str, worker: int, count: int, barrier: Any, results: Any) -> None:
    """One process's `count` additions to the shared model state, each through the retry loop."""
    ledger = LocalLedger(Path(folder))
    barrier.wait(BARRIER_TIMEOUT_S)
    attempts = sum(add_with_retries(ledger, drift_request(f"p{worker}-{i}")) for i in range(count))
    results.put((worker, attempts))


def run_processes(target: Any, arguments: list[tuple[Any, ...]]) -> list[Any]:
    """Run `target(*arguments[i], barrier, results)` in fresh processes that start their work together;
    returns what each put in `results`."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads (Azurite's reader)
    barrier, results = context.Barrier(len(arguments)), context.Queue()
    processes = [context.Process(target=target, args=(*args, barrier, results)) for args in arguments]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        if process.exitcode != 0:
            raise AssertionError(f"worker process exited with {process.exitcode}")
    return outcomes
