"""Helpers for the policy and ledger tests: trigger requests as the parsers build them, and entry points for
the multi-process tests of the local record store (run under `spawn`, so they live in an importable module,
not in a test file)."""

from __future__ import annotations

import multiprocessing
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from function_app.events.triggers import KIND_BLOB, KIND_DRIFT, KIND_HTTP, BlobRef, TriggerRequest
from function_app.ledger.store import LocalRecordStore
from function_app.policy.rules import PolicySettings

MODEL = "digits"
ACCOUNT = "retrainlanding"
CONTAINER = "landing"
T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
SETTINGS = PolicySettings(quiet_seconds=60, max_wait_seconds=300, cooldown_seconds=600, max_runs_per_day=3)
BARRIER_TIMEOUT_S = 30.0
RESULT_TIMEOUT_S = 60.0
CREATE_ROUNDS = 20


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


def drift_request(run_id: str, now: datetime = T0, model_name: str = MODEL) -> TriggerRequest:
    return TriggerRequest(
        kind=KIND_DRIFT,
        event_id=f"evt-{run_id}",
        dedupe_key=f"drift:{run_id}",
        model_name=model_name,
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


def create_in_process(folder: str, worker: int, barrier: Any, results: Any) -> None:
    """One process's creates of the shared records 'race/r-<n>.json' (n < CREATE_ROUNDS), in a row, started
    together with the other processes; each writes its own worker number, so the winner can be checked."""
    store = LocalRecordStore(Path(folder))
    barrier.wait(BARRIER_TIMEOUT_S)
    won = [store.create(f"race/r-{n}.json", str(worker).encode(), f"w{worker}") for n in range(CREATE_ROUNDS)]
    results.put((worker, won))


def hold_in_process(folder: str, name: str, results: Any) -> None:
    """Take the hold `name`, report whether it was had, and keep it until this process is killed."""
    store = LocalRecordStore(Path(folder))
    with store.hold(name) as held:
        results.put(held is not None)
        threading.Event().wait()  # never set: the test kills this process while it holds


def run_processes(target: Any, arguments: list[tuple[Any, ...]]) -> list[Any]:
    """Run `target(*arguments[i], barrier, results)` in fresh processes that start their work together;
    returns what each put in `results`."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads (Azurite's reader)
    barrier, results = context.Barrier(len(arguments)), context.Queue()
    processes = [context.Process(target=target, args=(*args, barrier, results)) for args in arguments]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=RESULT_TIMEOUT_S) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        if process.exitcode != 0:
            raise AssertionError(f"worker process exited with {process.exitcode}")
    return outcomes
