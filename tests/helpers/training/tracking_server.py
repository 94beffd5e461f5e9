"""A real MLflow tracking server that demands basic auth, as a team's server behind a proxy does.

MLflow's own server application (`mlflow.server.app`, the Flask app `mlflow server` runs) on a SQLite store,
proxying artifacts to a local folder, served on loopback by the standard library's WSGI server in a process
of its own (started in a session of its own, killed whole at the end). Every request without the expected
`Authorization: Basic` header is answered 401 before MLflow sees it. The user and password reach the server
through its environment, never its command line: the tests that use it look for the password in the process
table too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

READY_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30

_SERVER = r"""
import base64, os, sys
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from mlflow.server import constants

os.environ[constants.BACKEND_STORE_URI_ENV_VAR] = os.environ["TEST_TRACKING_STORE"]
os.environ[constants.ARTIFACT_ROOT_ENV_VAR] = "mlflow-artifacts:/"
os.environ[constants.SERVE_ARTIFACTS_ENV_VAR] = "true"
os.environ[constants.ARTIFACTS_DESTINATION_ENV_VAR] = os.environ["TEST_TRACKING_ARTIFACTS"]
credentials = f"{os.environ.pop('TEST_TRACKING_USER')}:{os.environ.pop('TEST_TRACKING_PASSWORD')}"
expected = "Basic " + base64.b64encode(credentials.encode()).decode()

from mlflow.server import app


def guarded(environ, start_response):
    if environ.get("HTTP_AUTHORIZATION") != expected:
        challenge = ("WWW-Authenticate", 'Basic realm="mlflow"')
        start_response("401 Unauthorized", [challenge, ("Content-Length", "0")])
        return [b""]
    return app(environ, start_response)


class Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):
        pass


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


server = make_server("127.0.0.1", 0, guarded, server_class=Server, handler_class=Quiet)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@dataclass(frozen=True)
class TrackingServer:
    """Where the server listens, and the files it keeps (its store and its artifacts)."""

    port: int
    store: Path
    artifacts: Path
    log: Path

    def uri(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"


@contextlib.contextmanager
def basic_auth_tracking_server(folder: Path, user: str, password: str) -> Iterator[TrackingServer]:
    """A tracking server keeping its store and artifacts in `folder`, answering only `user:password`."""
    folder.mkdir(parents=True, exist_ok=True)
    store, artifacts, log = folder / "mlflow.db", folder / "artifacts", folder / "server.log"
    artifacts.mkdir(exist_ok=True)
    environ = {
        **os.environ,
        "TEST_TRACKING_STORE": f"sqlite:///{store}",
        "TEST_TRACKING_ARTIFACTS": str(artifacts),
        "TEST_TRACKING_USER": user,
        "TEST_TRACKING_PASSWORD": password,
    }
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        environ.pop(name, None)
    with log.open("wb") as errors:
        process = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            cwd=folder, env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
            start_new_session=True,
        )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the port, once it listens; nothing if it died first
        if not line.strip().isdigit():
            process.wait(timeout=READY_TIMEOUT_S)
            pytest.fail(f"the tracking server did not start:\n{log.read_text(errors='replace')[-4000:]}")
        yield TrackingServer(int(line), store, artifacts, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)
        if process.stdout is not None:
            process.stdout.close()
