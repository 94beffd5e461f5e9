"""No secret is written anywhere: a run given passwords in its MLflow tracking URI and its data URL leaves
no byte of them in its state folder (records, step logs, cache entries, the MLflow store) or its output.

One real `retrain run` (the root CLI, in its own process, so every byte it and its steps print is seen)
tracks to a loopback HTTP server that demands basic auth and refuses every MLflow call (403, which MLflow
does not retry): training goes on without tracking, and every path that writes the URI is exercised. The
server also shows that the password still reached MLflow, the one process that needs it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from components.local import RunStore
from components.model_config import MODELS_DIR_VARIABLE
from components.request import COMPLETED
from components.specs import REPO_ROOT
from training.local_state import STATE_DIR_VARIABLE
from training.tasks.tabular.sample_data import write_sample_batches

USER = "trainer"
TRACKING_PASSWORD = "Tr4ckPw7Zq9"
DATA_PASSWORD = "D4taPw3Xk8"
TOKEN = "T0kenQs5Vw2"
SECRETS = (TRACKING_PASSWORD, DATA_PASSWORD, TOKEN)


def _forms(secret: str) -> list[bytes]:
    """The ways a secret could be written: as is, and inside a basic-auth header."""
    return [secret.encode(), base64.b64encode(f"{USER}:{secret}".encode())]


def leaks(data: bytes) -> list[str]:
    return [secret for secret in SECRETS if any(form in data for form in _forms(secret))]


class _TrackingServer(ThreadingHTTPServer):
    """MLflow's REST endpoint, refusing everything; it records the Authorization header of each call."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Refuse)
        self.authorizations: list[str | None] = []


class _Refuse(BaseHTTPRequestHandler):
    server: _TrackingServer

    def _refuse(self) -> None:
        self.server.authorizations.append(self.headers.get("Authorization"))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = json.dumps({"error_code": "PERMISSION_DENIED", "message": "this store refuses"}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _refuse

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def tracking_server() -> Iterator[_TrackingServer]:
    server = _TrackingServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def retrain(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`retrain ...` as a user runs it, in its own process on state folder `home`; its whole output."""
    environ = {
        **os.environ,
        STATE_DIR_VARIABLE: str(home),
        MODELS_DIR_VARIABLE: str(home.parent / "no-model-configs"),
        "PYTHONPATH": str(REPO_ROOT),
    }
    environ.pop("MLFLOW_TRACKING_URI", None)  # the register step's registry: the state folder's SQLite
    return subprocess.run(
        [sys.executable, "-m", "retrain_cli", *argv],
        cwd=REPO_ROOT, env=environ, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


class Outputs:
    def __init__(self) -> None:
        self.results: dict[str, subprocess.CompletedProcess[str]] = {}

    def add(self, name: str, result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
        self.results[name] = result
        print(f"--- {name}: exit {result.returncode}\n{result.stdout}{result.stderr}")  # shown on failure
        return result


@pytest.fixture(scope="module")
def leaky_run(
    tmp_path_factory: pytest.TempPathFactory, tracking_server: _TrackingServer
) -> tuple[Path, Outputs, int]:
    folder = tmp_path_factory.mktemp("secrets")
    home = folder / "home"
    write_sample_batches(folder / "batches", batches=6)
    raw = folder / "raw"
    raw.mkdir()
    (folder / "batches" / "batch-0001.csv").rename(raw / "batch-0001.csv")  # ~300 rows: a tiny run
    port = tracking_server.server_address[1]
    outputs = Outputs()
    outputs.add(
        "run with a data URL",
        retrain(
            home,
            "run",
            "--task",
            "tabular",
            "--data",
            f"https://{USER}:{DATA_PASSWORD}@example.com/raw?token={TOKEN}",
        ),
    )
    outputs.add(
        "submit with a data URL",
        retrain(
            home, "submit", "--dry-run", "--model-name", "digits", "--task", "tabular",
            "--data", f"http://{USER}:{DATA_PASSWORD}@127.0.0.1:{port}/devstoreaccount1/landing/?token={TOKEN}",
        ),
    )  # fmt: skip
    outputs.add(
        "run",
        retrain(
            home, "run", "--task", "tabular", "--data", str(raw), "--epochs", "1",
            "--task-option", "hidden_width=8",
            "--param", "checkpoint_every_seconds=off",
            "--param", f"mlflow_tracking_uri=http://{USER}:{TRACKING_PASSWORD}@127.0.0.1:{port}",
        ),
    )  # fmt: skip
    outputs.add("runs --json", retrain(home, "runs", "--json"))
    outputs.add("runs", retrain(home, "runs"))
    return home, outputs, port


def test_a_data_url_with_a_password_is_refused_in_one_line_that_hides_it(leaky_run):
    _, outputs, _ = leaky_run
    result = outputs.results["run with a data URL"]
    assert result.returncode != 0
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    # (argparse made it a path, which has one '/' after the scheme)
    assert line.startswith("retrain: error: --data https:/***@example.com/raw?token=***: no such folder")
    assert not leaks(line.encode())


def test_a_blob_data_url_with_a_password_is_refused_by_submit_in_one_line_that_hides_it(leaky_run):
    _, outputs, port = leaky_run
    result = outputs.results["submit with a data URL"]
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"retrain: error: --data 'http://127.0.0.1:{port}/devstoreaccount1/landing/': credentials do not "
        "belong in the URL"
    )


def test_the_tracking_password_reaches_mlflow_but_no_record_log_or_output(leaky_run, tracking_server):
    home, outputs, port = leaky_run
    run = outputs.results["run"]
    assert run.returncode == 0, run.stderr[-3000:]
    # MLflow got the password it needs: it authenticated to the tracking server with it.
    basic = "Basic " + base64.b64encode(f"{USER}:{TRACKING_PASSWORD}".encode()).decode()
    assert tracking_server.authorizations and set(tracking_server.authorizations) == {basic}

    (record,) = RunStore(home / "runs").list()
    assert record.status == COMPLETED
    assert record.parameters["mlflow_tracking_uri"] == f"http://***@127.0.0.1:{port}"
    # The train step is told the tracking URI without its user info (the password went by environment).
    command = record.step("train").command
    assert command[command.index("--mlflow-tracking-uri") + 1] == f"http://127.0.0.1:{port}"
    assert "experiment tracking failed" in Path(record.step("train").log).read_text()
    listed = json.loads(outputs.results["runs --json"].stdout)
    assert [item["run_id"] for item in listed] == [record.run_id]

    leaked = {}
    for path in sorted(home.rglob("*")):  # records, logs, cache entries, the MLflow store and artifacts
        if path.is_file() and not path.is_symlink() and (found := leaks(path.read_bytes())):
            leaked[str(path.relative_to(home))] = found
    assert leaked == {}
    for name, result in outputs.results.items():
        assert leaks((result.stdout + result.stderr).encode()) == [], name
