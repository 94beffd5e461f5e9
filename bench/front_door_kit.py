"""What the front door's benchmarks share: app settings, a fresh Azurite, Blob-created events, and the
blob trigger's handler invoked as the Functions worker invokes it (bench/triggers.py, bench/burst.py)."""

from __future__ import annotations

import base64
import os
import random
import re
import secrets
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
AZURITE_BLOB = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"
CLAIM_BYTES = 890  # what one claim weighs in the ledger: the baselines write blobs of the same size
_LISTENING = re.compile(r"successfully listens on (?P<url>http://\S+)")


def settings(home: Path, **overrides: str) -> dict[str, str]:
    return {
        "RETRAIN_SUBMITTER": "dry-run",
        "RETRAIN_HOME": str(home),
        "RETRAIN_MODEL_NAME": "digits",
        "RETRAIN_BLOB_ACCOUNT": "retraindata",
        "RETRAIN_BLOB_CONTAINER": "landing",
        "RETRAIN_BLOB_PREFIX": "digits/",
        **overrides,
    }


def ledger_settings(endpoint: str, connection: str, container: str) -> dict[str, str]:
    """App settings for a front door whose ledger is `container` on Azurite, where nothing is ever flushed
    on its own: with a one-hour quiet period every event joins one pending batch."""
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient.from_connection_string(connection).create_container(container)
    return settings(
        Path(tempfile.mkdtemp(prefix="retrain-bench-")),
        RETRAIN_LEDGER=f"{endpoint}/{container}/front-door",
        RETRAIN_STORAGE_CONNECTION_STRING=connection,
        RETRAIN_DEBOUNCE_QUIET_SECONDS="3600",
        RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS="3600",
    )


@contextmanager
def azurite() -> Iterator[tuple[str, str, str, int]]:
    """A fresh Azurite with a random account: (account, blob endpoint, connection string, its pid)."""
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
        yield account, endpoint, connection, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def blob_events(originals: int, redeliveries: int, blobs: int, rng: random.Random) -> list[dict]:
    """`originals` Blob-created events, new versions of `blobs` blobs in turn, plus `redeliveries` repeats
    of some of them, shuffled. Every event of a blob's later version has a later sequencer."""
    from function_app.local.watch import LandedBlob, blob_created_event
    from function_app.settings.app import AppSettings

    scope = AppSettings.from_environ(settings(Path("unused"))).blob
    assert scope is not None
    events, versions = [], [0] * blobs
    for number in range(originals):
        blob = number % blobs
        versions[blob] += 1
        landed = LandedBlob(
            f"digits/batch-{blob:04d}.csv", f"0x8DE{blob:04X}{versions[blob]:06X}", 4096, number
        )
        events.append(blob_created_event(scope, landed, number + 1, datetime.now(UTC)))
    events += rng.choices(events, k=redeliveries)
    rng.shuffle(events)
    return events


def handler() -> Callable[[dict], Callable[[], None]]:
    """Turns an event into the call the Functions worker makes: the worker's own conversion happens here,
    before the call, because it is not ours to time."""
    from function_app.blueprints.blob_events import on_blob_created
    from function_app.local.worker import worker_event

    def prepare(payload: dict) -> Callable[[], None]:
        event = worker_event(payload)
        return lambda: on_blob_created(event)

    return prepare


def deliver_each(
    environ: dict[str, str], payloads: list[dict], floor: str | None = None
) -> tuple[list[float], list[float]]:
    """Start a front door from `environ` and hand it `payloads` one after another: seconds per event.

    With `floor` (a container in the ledger's account), each event is followed by its bare cost in SDK
    calls, timed alike: a read of a blob that does not exist (the model's state before any flush) and a
    create-if-absent of a fresh claim-sized blob. Interleaved, both see the same load on a shared machine.
    """
    from azure.core.exceptions import ResourceNotFoundError
    from azure.storage.blob import BlobServiceClient

    from function_app import runtime

    runtime.start(environ)
    prepare = handler()
    calls = [prepare(payload) for payload in payloads]
    container = None
    if floor is not None:
        service = BlobServiceClient.from_connection_string(environ["RETRAIN_STORAGE_CONNECTION_STRING"])
        container = service.create_container(floor)
    data = b"x" * CLAIM_BYTES
    seconds, bare = [], []
    for number, call in enumerate(calls):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
        if container is None:
            continue
        started = time.perf_counter()
        with suppress(ResourceNotFoundError):
            container.download_blob("models/none.json").readall()
        container.upload_blob(f"claims/{number:06d}.json", data, overwrite=False)
        bare.append(time.perf_counter() - started)
    return seconds, bare


def percentile(values: list[float], percent: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(percent / 100 * (len(ordered) - 1)))]
