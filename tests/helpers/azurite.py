"""Azurite, the Azure Storage emulator, run for the tests: started on a port the OS picks, with an account
made up for the run, and stopped afterwards (the `azurite` fixture in tests/conftest.py runs one per
session)."""

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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import pytest

if TYPE_CHECKING:
    from azure.storage.blob import BlobServiceClient, ContainerClient

REPO_ROOT = Path(__file__).resolve().parents[2]
AZURITE_BLOB = REPO_ROOT / "node_modules" / ".bin" / "azurite-blob"
AZURITE_START_TIMEOUT_S = 120.0  # a bound on a hung start, not a speed check: a loaded machine is slow
AZURITE_STOP_TIMEOUT_S = 10.0
_LISTENING = re.compile(r"successfully listens on (?P<url>http://\S+)")
_OUTPUT_KEPT_LINES = 200


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


@contextmanager
def running_azurite(location: Path) -> Iterator[Azurite]:
    """An Azurite storing its data in `location`, with an account name and key generated for it alone;
    stopped on leaving."""
    account = f"retrain{secrets.token_hex(6)}"
    key = base64.b64encode(secrets.token_bytes(64)).decode("ascii")
    process = _start_azurite(location, f"{account}:{key}")
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
