"""The front door's concurrent burst and storm (parts 4 and 5 of bench/triggers.py): DELIVERERS spawned
processes, each with its own front door, released together by a barrier to pull events from one shared
cursor; the baseline is as many processes doing plain create-if-absent uploads in the same Azurite.

The burst is 5,000 events, mostly first arrivals. The storm is two events per blob: each blob's event, and
either Event Grid's redelivery of it or a second write event for the same blob version. Every duplicate
costs the ledger two conditional writes (the claim it lost, and its own record), a first arrival one, so
the storm's floor is Azurite's create-if-absent rate times the events over the writes they need."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import random
import statistics
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from front_door_kit import CLAIM_BYTES, azurite, blob_events, handler, ledger_settings, percentile

BURST_BLOBS, BURST_VERSIONS, BURST_REDELIVERIES, DELIVERERS = 2000, 2, 1000, 8
STORM_BLOBS = 1000  # each with two events
SETUP_TIMEOUT_S = 300  # a process that is not ready by then has failed; the others stop waiting


def _take(cursor: Any) -> int:
    with cursor.get_lock():
        index = cursor.value
        cursor.value += 1
    return index


def _drain(calls: list[Callable[[], None]], cursor: Any, barrier: Any) -> dict:
    """Wait for every process to be ready, then call what the shared cursor hands out until none is left."""
    seconds, errors, first_error = [], Counter(), None
    try:
        barrier.wait(SETUP_TIMEOUT_S)
    except threading.BrokenBarrierError:  # another process failed to start: report, so nobody waits on us
        return {"setup_error": f"another process failed to start, or set-up took over {SETUP_TIMEOUT_S} s"}
    started = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process on the machine
    cpu = time.process_time()
    while (index := _take(cursor)) < len(calls):
        begun = time.perf_counter()
        try:
            calls[index]()
        except Exception as error:  # Event Grid would redeliver: count it, report it, carry on
            errors[type(error).__name__] += 1
            first_error = first_error or f"{type(error).__name__}: {error}"
        seconds.append(time.perf_counter() - begun)
    return {
        "started": started,
        "ended": time.perf_counter(),
        "cpu_s": time.process_time() - cpu,
        "seconds": seconds,
        "errors": dict(errors),
        "first_error": first_error,
    }


def _deliverer(
    environ: dict[str, str], payloads: list[dict], cursor: Any, barrier: Any, results: Any
) -> None:
    """One deliverer process: its own front door from app settings, the handler as the worker calls it."""
    try:
        from function_app import runtime

        runtime.start(environ)
        prepare = handler()
        calls = [prepare(payload) for payload in payloads]
    except BaseException:
        barrier.abort()  # the others stop waiting for this one
        results.put({"setup_error": traceback.format_exc()})
        raise
    results.put(_drain(calls, cursor, barrier))


def _creator(connection: str, prefix: str, count: int, cursor: Any, barrier: Any, results: Any) -> None:
    """One baseline process: create-if-absent of fresh claim-sized blobs, as plainly as the SDK allows."""
    try:
        from azure.storage.blob import BlobServiceClient

        container = BlobServiceClient.from_connection_string(connection).get_container_client("scratch")
        data = b"x" * CLAIM_BYTES

        def create(name: str) -> Callable[[], None]:
            return lambda: container.upload_blob(name, data, overwrite=False)

        calls = [create(f"{prefix}/{index:05d}.json") for index in range(count)]
    except BaseException:
        barrier.abort()
        results.put({"setup_error": traceback.format_exc()})
        raise
    results.put(_drain(calls, cursor, barrier))


def _cpu_seconds(pid: int) -> float:
    """CPU seconds a process has used so far (Linux: user + system time from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _together(target: Callable[..., None], args: tuple, count: int, azurite_pid: int) -> dict:
    """Run DELIVERERS spawned processes of `target` over `count` calls: their rate and latencies, and the
    CPU each call cost in the processes and in Azurite (the two share this machine's cores)."""
    context = multiprocessing.get_context("spawn")
    cursor, barrier, results = context.Value("q", 0), context.Barrier(DELIVERERS), context.Queue()
    processes = [
        context.Process(target=target, args=(*args, cursor, barrier, results), name=f"bench-{number}")
        for number in range(DELIVERERS)
    ]
    for process in processes:
        process.start()
    azurite_cpu = _cpu_seconds(azurite_pid)  # the processes' set-up makes no requests
    reports = []
    try:
        for _ in processes:
            reports.append(results.get(timeout=SETUP_TIMEOUT_S + 600))
    except queue.Empty:
        raise SystemExit(f"{target.__name__}: a process neither finished nor failed in time") from None
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
    azurite_cpu = _cpu_seconds(azurite_pid) - azurite_cpu
    failed = [report["setup_error"] for report in reports if "setup_error" in report]
    if failed:
        raise SystemExit(f"{target.__name__}: a process failed to start:\n{failed[0]}")
    seconds = [value for report in reports for value in report["seconds"]]
    errors: Counter[str] = Counter()
    for report in reports:
        errors.update(report["errors"])
    wall = max(report["ended"] for report in reports) - min(report["started"] for report in reports)
    return {
        "calls": len(seconds),
        "wall_s": wall,
        "per_s": len(seconds) / wall,
        "client_cpu_ms_per_call": sum(report["cpu_s"] for report in reports) / len(seconds) * 1000,
        "azurite_cpu_ms_per_call": azurite_cpu / len(seconds) * 1000,
        "p50_ms": percentile(seconds, 50) * 1000,
        "p99_ms": percentile(seconds, 99) * 1000,
        "errors": dict(errors),
        "first_error": next((report["first_error"] for report in reports if report["first_error"]), None),
        "per_process": [len(report["seconds"]) for report in reports],
    }


def _newest_versions(payloads: list[dict]) -> dict[str, str]:
    newest: dict[str, tuple[str, str]] = {}
    for payload in payloads:
        data = payload["data"]
        if data["url"] not in newest or data["sequencer"] > newest[data["url"]][0]:
            newest[data["url"]] = (data["sequencer"], data["eTag"])
    return {url: f"etag:{etag}" for url, (_, etag) in newest.items()}


def _flush_check(environ: dict[str, str], payloads: list[dict]) -> dict:
    """One flush after the burst: exactly one submission, pinning every blob at its newest version."""
    from function_app import runtime

    front_door = runtime.start(environ)
    started = time.perf_counter()
    records = front_door.flush(ignore_quiet=True)
    seconds = time.perf_counter() - started
    expected = _newest_versions(payloads)
    pinned = {pin.url: pin.fingerprint for record in records for pin in record.inputs}
    events = sum(len(record.events) for record in records)
    ok = len(records) == 1 and pinned == expected
    return {
        "ok": ok,
        "submissions": len(records),
        "inputs": len(pinned),
        "expected_inputs": len(expected),
        "events_taken": events,
        "distinct_events": len({json.dumps(payload, sort_keys=True) for payload in payloads}),
        "flush_s": seconds,
    }


def burst() -> dict:
    originals = BURST_BLOBS * BURST_VERSIONS
    payloads = blob_events(originals, BURST_REDELIVERIES, BURST_BLOBS, random.Random(20261201))
    result = _measured(payloads, writes=len(payloads))
    return {"blobs": BURST_BLOBS, "redeliveries": BURST_REDELIVERIES, **result}


def storm_events(rng: random.Random) -> list[dict]:
    """Two events for each of STORM_BLOBS blobs, shuffled: its Blob-created event, then, for every other blob,
    Event Grid's redelivery of that event, and for the others a second write event for the same blob version
    (another event id, as two subscriptions or a second write of one version bring)."""
    firsts = blob_events(STORM_BLOBS, 0, STORM_BLOBS, rng)
    seconds = [
        event if number % 2 == 0 else {**event, "id": str(uuid.UUID(int=rng.getrandbits(128)))}
        for number, event in enumerate(firsts)
    ]
    events = firsts + seconds
    rng.shuffle(events)
    return events


def storm() -> dict:
    payloads = storm_events(random.Random(20261206))
    # A first arrival writes its claim; a duplicate tries the claim (which exists) and writes its own record.
    writes = STORM_BLOBS + 2 * (len(payloads) - STORM_BLOBS)
    return {"blobs": STORM_BLOBS, **_measured(payloads, writes)}


def _measured(payloads: list[dict], writes: int) -> dict:
    """Our rate over `payloads` between two baselines of as many create-if-absent uploads, then one flush;
    `floor_per_s` is the events a second the baseline's rate allows when they need `writes` writes."""
    count = len(payloads)
    with azurite() as (_, endpoint, connection, pid):
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(connection).create_container("scratch")
        environ = ledger_settings(endpoint, connection, "ledger")
        # The baseline runs before and after ours, so that neither side alone gets the emptier store.
        before = _together(_creator, (connection, "before", count), count, pid)
        print(f"baseline (before): {before['per_s']:.0f} creates/s", flush=True)
        ours = _together(_deliverer, (environ, payloads), count, pid)
        print(f"ours: {ours['per_s']:.0f} events/s, errors {ours['errors'] or 'none'}", flush=True)
        after = _together(_creator, (connection, "after", count), count, pid)
        print(f"baseline (after): {after['per_s']:.0f} creates/s", flush=True)
        check = _flush_check(environ, payloads)
    baseline = statistics.mean([before["per_s"], after["per_s"]])
    floor = baseline * count / writes
    return {
        "events": count,
        "writes": writes,
        "processes": DELIVERERS,
        "ours": ours,
        "baseline_before": before,
        "baseline_after": after,
        "baseline_per_s": baseline,
        "floor_per_s": floor,
        "ratio": ours["per_s"] / floor,
        "flush": check,
    }
