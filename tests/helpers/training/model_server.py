"""`mlflow models serve` and `retrain serve` as a user runs them: the real command in a process group of
its own, ready once it answers `GET /ping`, and stopped (the whole group: the CLI and the uvicorn it
starts) when the test ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

PING_TRIES = 240
PING_INTERVAL_S = 0.25  # spent waiting on the server's process, so an early exit is seen at once
STOP_TIMEOUT_S = 30
OUTPUT_SHOWN = 6000


def free_port() -> int:
    # mlflow models serve cannot be given port 0 (it would pass uvicorn no port, which then takes 8000).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def mlflow_models_serve(model_uri: str, tracking_uri: str, log: Path) -> Iterator[str]:
    """The base URL of `mlflow models serve -m model_uri` in this environment, once it answers /ping."""
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    # The CLI runs `uvicorn` by name: this environment's scripts must come first on PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PATH": path}
    with serving(command, env, port, log, "mlflow models serve") as url:
        yield url


@contextlib.contextmanager
def retrain_serve(model_name: str, environ: dict[str, str], cwd: Path, log: Path) -> Iterator[str]:
    """The base URL of `retrain serve model_name` run with `environ` in `cwd`, once it answers /ping."""
    port = free_port()
    command = [sys.executable, "-m", "retrain_cli", "serve", model_name, "--port", str(port)]
    with serving(command, environ, port, log, "retrain serve", cwd=cwd) as url:
        yield url


@contextlib.contextmanager
def serving(
    command: list[str], env: dict[str, str], port: int, log: Path, what: str, cwd: Path | None = None
) -> Iterator[str]:
    """`command` in a process group of its own until the server it starts on `port` answers /ping; the
    whole group (the CLI and the uvicorn it starts) is killed when the block ends."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until_ready(process, url, log, what)
        yield url
    finally:
        _stop_group(process)


def _wait_until_ready(process: subprocess.Popen[bytes], url: str, log: Path, what: str) -> None:
    for _ in range(PING_TRIES):
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, or still loading the model
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = process.wait(timeout=PING_INTERVAL_S)
            pytest.fail(
                f"{what} exited with code {code} before it was ready:\n{_tail(log)}",
                pytrace=False,
            )
    pytest.fail(
        f"{what} did not answer {url}/ping after {PING_TRIES} tries:\n{_tail(log)}",
        pytrace=False,
    )


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=STOP_TIMEOUT_S)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-OUTPUT_SHOWN:] or "(no output)"


def invoke(url: str, body: bytes, content_type: str) -> tuple[int, str]:
    """POST `body` to the server's /invocations: the status and the answer's text."""
    request = urllib.request.Request(
        f"{url}/invocations", data=body, headers={"Content-Type": content_type}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()
