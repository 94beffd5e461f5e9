"""Shared fixtures: Azurite, the Azure Storage emulator, for every test that talks to Blob Storage.

`azurite` (session) starts one emulator with a random account and key; `blob_container` (function) gives a
test its own freshly created container and deletes it afterwards.
"""

from __future__ import annotations

import base64
import collections
import os
import queue
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import pytest

if TYPE_CHECKING:
    from azure.storage.blob import BlobServiceClient, ContainerClient

REPO_ROOT = Path(__file__).resolve().parents[1]
AZURITE_BLOB = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"
AZURITE_START_TIMEOUT_S = 120.0  # a bound on a hung start, not a speed check: a loaded machine is slow
AZURITE_STOP_TIMEOUT_S = 10.0
_LISTENING = re.compile(r"successfully listens on (?P<url>http://\S+)")
_OUTPUT_KEPT_LINES = 200

# The files whose tests take longest, longest first. `make test` spreads whole files over two workers
# (--dist loadfile), handing the next file to whichever is free; starting with the long ones keeps one worker
# from ending the suite alone on a long file while the other is idle. Only the order changes.
SLOWEST_FILES = (
    "tests/test_demo.py",
    "tests/components/test_concurrent_runs.py",
    "tests/components/test_readme_task.py",
    "tests/training/test_resume.py",
    "tests/components/test_local_pipeline.py",
    "tests/training/test_orphan_workers.py",
    "tests/training/test_checkpoint_integrity.py",
    "tests/training/test_image_resume.py",
    "tests/training/test_tracking.py",
    "tests/training/test_checkpoint_lease.py",
    "tests/training/test_nonfinite_loss.py",
    "tests/function_app/test_storm.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: index for index, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(SLOWEST_FILES)))


@dataclass(frozen=True)
class Azurite:
    """A running emulator: its account (name and key), its blob endpoint and a connection string for it."""

    account: str
    blob_endpoint: str
    account_key: str = field(repr=False)  # kept out of test reports
    connection_string: str = field(repr=False)  # carries the account key

    def service_client(self, **client_options: Any) -> BlobServiceClient:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string, **client_options)

    def new_container(self, **client_options: Any) -> ContainerClient:
        """Create a container with a unique name; `client_options` go to the client (e.g. block sizes)."""
        container = self.service_client(**client_options).get_container_client(f"test-{secrets.token_hex(8)}")
        container.create_container()
        return container

    def container_url(self, container_name: str) -> str:
        return f"{self.blob_endpoint}/{container_name}"


class _OutputCollector:
    """Drains a process's output on a thread (a full pipe would stall the process) and keeps the tail."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.kept: collections.deque[str] = collections.deque(maxlen=_OUTPUT_KEPT_LINES)
        self._thread = threading.Thread(target=self._drain, name="azurite-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        for line in self._stream:
            self.kept.append(line.rstrip("\n"))
            self.lines.put(line)
        self.lines.put(None)  # end of output: the process has exited

    def text(self) -> str:
        return "\n".join(self.kept) or "(no output)"

    def join(self) -> None:
        self._thread.join(timeout=AZURITE_STOP_TIMEOUT_S)


def _start_azurite(location: Path, accounts: str) -> subprocess.Popen[str]:
    if not AZURITE_BLOB.exists():
        pytest.fail(
            f"Azurite is not installed ({AZURITE_BLOB} is missing); run `npm ci` in {REPO_ROOT} first",
            pytrace=False,
        )
    command = [
        str(AZURITE_BLOB),
        "--blobHost", "127.0.0.1",
        "--blobPort", "0",  # the OS picks a free port, and Azurite reports it: no race with other processes
        "--location", str(location),
        "--disableTelemetry",
        "--skipApiVersionCheck",  # the SDK may speak a newer API version than this Azurite knows
        "--loose",
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, "AZURITE_ACCOUNTS": accounts},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_until_listening(process: subprocess.Popen[str], output: _OutputCollector) -> str:
    """The URL Azurite listens on, read from its own announcement."""
    deadline = time.monotonic() + AZURITE_START_TIMEOUT_S
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = output.lines.get(timeout=remaining)
        except queue.Empty:
            break
        if line is None:
            pytest.fail(
                f"Azurite exited with code {process.wait()} before listening; its output:\n{output.text()}",
                pytrace=False,
            )
        if match := _LISTENING.search(line):
            return match["url"]
    pytest.fail(
        f"Azurite did not report listening within {AZURITE_START_TIMEOUT_S:.0f} s; its output so far:\n"
        f"{output.text()}",
        pytrace=False,
    )


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=AZURITE_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One Azurite for the whole session, with an account name and key generated for this session only."""
    account = f"retrain{secrets.token_hex(6)}"
    key = base64.b64encode(secrets.token_bytes(64)).decode("ascii")
    process = _start_azurite(tmp_path_factory.mktemp("azurite"), f"{account}:{key}")
    output = _OutputCollector(cast(IO[str], process.stdout))  # not None: stdout=PIPE
    try:
        listening_url = _wait_until_listening(process, output)
        blob_endpoint = f"{listening_url.rstrip('/')}/{account}"
        yield Azurite(
            account=account,
            blob_endpoint=blob_endpoint,
            account_key=key,
            connection_string=(
                f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
                f"BlobEndpoint={blob_endpoint};"
            ),
        )
    finally:
        _stop(process)
        output.join()
        cast(IO[str], process.stdout).close()


@pytest.fixture
def blob_container(azurite: Azurite) -> Iterator[ContainerClient]:
    """A new, empty container for one test; deleted afterwards."""
    container = azurite.new_container()
    yield container
    container.delete_container()
