"""Benchmark: the front door's cold start, and how long it takes to handle one event.

    make bench            (or: .venv/bin/python bench/triggers.py [--rounds R] [--events N])

1. Cold start: the time to import the root entry (function_entry.py: settings validated, the front door
   built, every trigger registered) divided by the time to import azure.ai.ml, which is what the entry
   must never load at start-up. Each is timed inside a fresh interpreter; the two alternate, several paired
   rounds, and the ratio is the median of each round's pair.                        (target <= 0.35)
2. Handling: the blob trigger's handler, invoked as the worker invokes it, for N Blob-created events (50
   blobs, 30 % of the events redeliveries, shuffled) one after another, with the ledger in Blob Storage on
   Azurite (started from node_modules/.bin/azurite-blob, as the tests start it) and dry-run submissions.
   It prints the p50 and p99 handling time per event, and how they move as the pending batch grows
   (every event lands in one debounced batch, the front door's heaviest steady state).

Writes bench/out/triggers.json; exits non-zero if the cold-start target is missed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT = REPO_ROOT / "bench" / "out"
AZURITE_BLOB = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"
RATIO_TARGET = 0.35
BLOBS, DUPLICATE_SHARE = 50, 0.3
_LISTENING = re.compile(r"successfully listens on (?P<url>http://\S+)")
_TIMED_IMPORT = (
    "import time\nstarted = time.perf_counter()\nimport {module}\nprint(time.perf_counter() - started)\n"
)


def _settings(home: Path, **overrides: str) -> dict[str, str]:
    return {
        "RETRAIN_SUBMITTER": "dry-run",
        "RETRAIN_HOME": str(home),
        "RETRAIN_MODEL_NAME": "digits",
        "RETRAIN_BLOB_ACCOUNT": "retraindata",
        "RETRAIN_BLOB_CONTAINER": "landing",
        "RETRAIN_BLOB_PREFIX": "digits/",
        **overrides,
    }


def timed_import(module: str, environ: dict[str, str]) -> float:
    """Seconds to import `module` in a fresh interpreter started in the app root."""
    result = subprocess.run(
        [sys.executable, "-c", _TIMED_IMPORT.format(module=module)],
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(result.stdout.strip().splitlines()[-1])


def cold_start(rounds: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix="retrain-bench-"))
    base = {key: value for key, value in os.environ.items() if not key.startswith("RETRAIN_")}
    environ = {**base, **_settings(home)}
    timed_import("function_entry", environ)  # warm the file cache and bytecode for both sides alike
    timed_import("azure.ai.ml", environ)
    pairs = []
    for number in range(1, rounds + 1):
        if number % 2:
            entry, sdk = timed_import("function_entry", environ), timed_import("azure.ai.ml", environ)
        else:
            sdk, entry = timed_import("azure.ai.ml", environ), timed_import("function_entry", environ)
        pairs.append({"entry_s": entry, "azure_ai_ml_s": sdk, "ratio": entry / sdk})
        print(f"round {number}: entry {entry * 1000:.0f} ms, azure.ai.ml {sdk * 1000:.0f} ms", flush=True)
    return {
        "rounds": pairs,
        "entry_s": statistics.median(pair["entry_s"] for pair in pairs),
        "azure_ai_ml_s": statistics.median(pair["azure_ai_ml_s"] for pair in pairs),
        "ratio": statistics.median(pair["ratio"] for pair in pairs),
    }


@contextmanager
def azurite() -> Iterator[tuple[str, str, str]]:
    """A fresh Azurite with a random account: (account, blob endpoint, connection string)."""
    if not AZURITE_BLOB.exists():
        raise SystemExit(f"Azurite is not installed ({AZURITE_BLOB}); run `npm ci` first")
    account = f"bench{secrets.token_hex(6)}"
    key = base64.b64encode(secrets.token_bytes(64)).decode("ascii")
    location = tempfile.mkdtemp(prefix="azurite-bench-")
    process = subprocess.Popen(
        [str(AZURITE_BLOB), "--blobHost", "127.0.0.1", "--blobPort", "0", "--location", location,
         "--disableTelemetry", "--skipApiVersionCheck", "--loose"],
        cwd=REPO_ROOT,
        env={**os.environ, "AZURITE_ACCOUNTS": f"{account}:{key}"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        for line in process.stdout:  # Azurite announces its port; the bench has nothing to do until then
            if match := _LISTENING.search(line):
                endpoint = f"{match['url'].rstrip('/')}/{account}"
                break
        else:
            raise SystemExit(f"Azurite exited with code {process.wait()} before listening")
        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};BlobEndpoint={endpoint};"
        )
        # Keep reading its output, or a full pipe would stall it.
        threading.Thread(target=process.stdout.read, name="azurite-output", daemon=True).start()
        yield account, endpoint, connection
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def blob_events(count: int, rng: random.Random) -> list[dict]:
    """`count` Blob-created events over BLOBS blobs: new versions, and redeliveries of earlier events."""
    from function_app.local.watch import LandedBlob, blob_created_event
    from function_app.settings.app import AppSettings

    scope = AppSettings.from_environ(_settings(Path("unused"))).blob
    assert scope is not None
    originals = round(count * (1 - DUPLICATE_SHARE))
    events, versions = [], [0] * BLOBS
    for number in range(originals):
        blob = number % BLOBS
        versions[blob] += 1
        landed = LandedBlob(
            f"digits/batch-{blob:02d}.csv", f"0x8DE{blob:04X}{versions[blob]:06X}", 4096, number
        )
        events.append(blob_created_event(scope, landed, number + 1, datetime.now(UTC)))
    events += rng.choices(events, k=count - originals)
    rng.shuffle(events)
    return events


def handling(count: int) -> dict:
    from azure.storage.blob import BlobServiceClient

    from function_app import runtime
    from function_app.blueprints.blob_events import on_blob_created
    from function_app.local.cli import worker_event

    with azurite() as (_, endpoint, connection):
        BlobServiceClient.from_connection_string(connection).create_container("ledger")
        home = Path(tempfile.mkdtemp(prefix="retrain-bench-"))
        runtime.start(
            _settings(
                home,
                RETRAIN_LEDGER=f"{endpoint}/ledger/front-door",
                RETRAIN_STORAGE_CONNECTION_STRING=connection,
                RETRAIN_DEBOUNCE_QUIET_SECONDS="3600",
                RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS="3600",
            )
        )
        # The worker's conversion of each event happens before the handler runs: not ours to time.
        delivered = [worker_event(event) for event in blob_events(count, random.Random(20261129))]
        seconds = []
        for event in delivered:
            started = time.perf_counter()
            on_blob_created(event)
            seconds.append(time.perf_counter() - started)
    quarters = [seconds[index * count // 4 : (index + 1) * count // 4] for index in range(4)]
    return {
        "events": count,
        "p50_ms": _percentile(seconds, 50) * 1000,
        "p99_ms": _percentile(seconds, 99) * 1000,
        "max_ms": max(seconds) * 1000,
        "events_per_s": count / sum(seconds),
        "p50_ms_by_quarter": [round(_percentile(part, 50) * 1000, 2) for part in quarters],
    }


def _percentile(values: list[float], percent: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(percent / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="paired import rounds (default 7)")
    parser.add_argument("--events", type=int, default=1000, help="events to handle (default 1000)")
    args = parser.parse_args()

    start = cold_start(args.rounds)
    handled = handling(args.events)
    result = {"date": date.today().isoformat(), "cold_start": start, "handling": handled}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "triggers.json").write_text(json.dumps(result, indent=2) + "\n")
    ok = start["ratio"] <= RATIO_TARGET
    print(
        f"entry import / azure.ai.ml import  {start['ratio']:.3f} ({start['entry_s'] * 1000:.0f} ms / "
        f"{start['azure_ai_ml_s'] * 1000:.0f} ms, median of {args.rounds} pairs; target <= {RATIO_TARGET}): "
        f"{'ok' if ok else 'MISSED'}"
    )
    print(
        f"handling per event over {handled['events']}  p50 {handled['p50_ms']:.1f} ms, p99 "
        f"{handled['p99_ms']:.1f} ms, max {handled['max_ms']:.1f} ms "
        f"({handled['events_per_s']:.0f} events/s); p50 by quarter {handled['p50_ms_by_quarter']} ms"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
