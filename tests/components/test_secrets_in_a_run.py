"""No secret is written anywhere: a run given passwords in its MLflow tracking URI and its data URL, and a
task option named as a secret, leaves no byte of them in its state folder (records, step logs, cache
entries, checkpoints, model files, gate files), the MLflow store, its output or the process table.

One real `retrain run` (the root CLI, in its own process, so every byte it and its steps print is seen)
tracks to a loopback HTTP server that demands basic auth and refuses every MLflow call (403, which MLflow
does not retry): training goes on without tracking, and every path that writes the URI is exercised. The
server also shows that the password still reached MLflow, the one process that needs it.

Another tracks to a real MLflow server that demands the password (MLFLOW_TRACKING_URI=http://user:pw@...,
as a team's server is reached), with a user's task that takes an `api_token`: every step logs to it, the
model is registered in it, and MLflow prints its "View run ... at" links. The task itself checks that it was
given the real token, and records the process table whenever it is built (in the preflight, every step and
each torchrun worker), so the command lines are seen while the processes that could hold them live.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.training.tracking_server import TrackingServer, basic_auth_tracking_server

from components.local import RunStore
from components.model_config import MODELS_DIR_VARIABLE
from components.request import COMPLETED
from components.specs import REPO_ROOT
from core.task_ref import TASK_SECRETS_VARIABLE
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


# -- a real tracking server, and a task option that is a secret ----------------------------------------------

SERVER_PASSWORD = "Srv9Pw4Lk2Qe"
API_TOKEN = "ApiT0k8Rm3Zx"
PROCESS_TABLES_VARIABLE = "TOKEN_TASK_PROCESS_TABLES"

# A user's task that needs a token (to call an API, say): the tabular task, plus `api_token`. It refuses
# any token but the test's (it knows only its digest, since the file itself is registered with the model),
# and each time it is built it records the process table: every process's command line, with its pid.
TOKEN_TASK = f"""
import hashlib, os, pathlib, time

from training.tasks.tabular.task import TabularTask

TOKEN_SHA256 = {hashlib.sha256(API_TOKEN.encode()).hexdigest()!r}


def record_process_table():
    folder = os.environ.get({PROCESS_TABLES_VARIABLE!r})
    if not folder:
        return
    lines = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:  # it ended meanwhile
                continue
            command = command.replace(b"\\n", b"\\\\n").replace(b"\\0", b" ")  # one line a process
            lines.append(entry.name.encode() + b" " + command)
    name = f"{{os.getpid()}}-{{time.monotonic_ns()}}.txt"
    (pathlib.Path(folder) / name).write_bytes(b"\\n".join(lines))


class TokenTask(TabularTask):
    def __init__(self, api_token: str, **options):
        if hashlib.sha256(str(api_token).encode()).hexdigest() != TOKEN_SHA256:
            raise ValueError("api_token: not the token this model was given")
        super().__init__(**options)
        self.api_token = api_token
        record_process_table()

    def options(self):
        return {{**super().options(), "api_token": self.api_token}}
"""

MODEL_CONFIG = f"""
name = "tokens"

[task]
ref = "token_task.py:TokenTask"

[task.options]
api_token = "{API_TOKEN}"
hidden_width = 8

[gate]
first_model_floors = {{}}
floors = {{}}

[pipeline]
epochs = 1
checkpoint_every_seconds = "off"
"""


def tracked_leaks(data: bytes) -> list[str]:
    found = [secret for secret in (SERVER_PASSWORD, API_TOKEN) if secret.encode() in data]
    basic = base64.b64encode(f"{USER}:{SERVER_PASSWORD}".encode())
    return found + (["basic auth"] if basic in data else [])


@dataclass(frozen=True)
class TrackedRun:
    home: Path
    server: TrackingServer
    outputs: Outputs
    tables: Path
    pids: dict[str, int]


@dataclass(frozen=True)
class TrackedRetrain:
    """`retrain ...` with MLFLOW_TRACKING_URI carrying the password, as a user exports it, its output in
    `outputs/`; each command's pid is kept, to tell the user's own command line from those the product
    writes."""

    home: Path
    models: Path
    uri: str
    tables: Path
    outputs: Path
    pids: dict[str, int]

    def start(self, name: str, *argv: str, environ: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        given = {
            **os.environ,
            STATE_DIR_VARIABLE: str(self.home),
            MODELS_DIR_VARIABLE: str(self.models),
            "PYTHONPATH": str(REPO_ROOT),
            "MLFLOW_TRACKING_URI": self.uri,
            PROCESS_TABLES_VARIABLE: str(self.tables),
            **(environ or {}),
        }
        given.pop("MLFLOW_REGISTRY_URI", None)
        self.outputs.mkdir(exist_ok=True)
        with (
            (self.outputs / f"{name}.out").open("wb") as out,
            (self.outputs / f"{name}.err").open("wb") as err,
        ):
            process = subprocess.Popen(
                [sys.executable, "-m", "retrain_cli", *argv], cwd=REPO_ROOT, env=given, stdout=out, stderr=err
            )
        self.pids[name] = process.pid
        return process

    def result(self, name: str, process: subprocess.Popen[bytes]) -> subprocess.CompletedProcess[str]:
        process.wait(timeout=600)
        stdout, stderr = ((self.outputs / f"{name}.{kind}").read_text() for kind in ("out", "err"))
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrackedRun]:
    folder = tmp_path_factory.mktemp("tracked")
    home, models, tables = folder / "home", folder / "models", folder / "process-tables"
    models.mkdir()
    tables.mkdir()
    (models / "token_task.py").write_text(TOKEN_TASK)
    (models / "tokens.toml").write_text(MODEL_CONFIG)
    write_sample_batches(folder / "batches", batches=6)
    raw = folder / "raw"
    raw.mkdir()
    (folder / "batches" / "batch-0001.csv").rename(raw / "batch-0001.csv")  # ~300 rows: a tiny run
    outputs: Outputs = Outputs()
    pids: dict[str, int] = {}
    with basic_auth_tracking_server(folder / "server", USER, SERVER_PASSWORD) as server:
        uri = server.uri(USER, SERVER_PASSWORD)
        retrain = TrackedRetrain(home, models, uri, tables, folder / "outputs", pids)
        run = retrain.start("run", "run", "--model-name", "tokens", "--data", str(raw))
        outputs.add("run", retrain.result("run", run))
        (record,) = RunStore(home / "runs").list()
        task = ["--task", f"{models / 'token_task.py'}:TokenTask", "--task-option", "hidden_width=8"]
        train = ["--data", record.step("prep").outputs["prepared_data"], "--epochs", "1"]
        # The user's own `retrain train`, tracking in its own process, the token kept off its command line
        # (given as `***`, its value in the environment)...
        alone = retrain.start(
            "train", "train", *task, "--task-option", "api_token=***", *train,
            "--out", str(home / "trained"), "--checkpoints", str(home / "trained-checkpoints"),
            environ={TASK_SECRETS_VARIABLE: json.dumps({"api_token": API_TOKEN})},
        )  # fmt: skip
        # ...and at once on two processes, the token typed on its command line.
        two = retrain.start(
            "train on two processes", "train", "--nproc", "2", *task, "--task-option",
            f"api_token={API_TOKEN}", *train, "--checkpoint-every-steps", "2",
            "--out", str(home / "trained-2"), "--checkpoints", str(home / "trained-2-checkpoints"),
        )  # fmt: skip
        outputs.add("train", retrain.result("train", alone))
        outputs.add("train on two processes", retrain.result("train on two processes", two))
        yield TrackedRun(home, server, outputs, tables, pids)


def test_a_run_tracked_to_a_password_protected_server_leaves_no_secret_anywhere(tracked_run):
    home, server, outputs = tracked_run.home, tracked_run.server, tracked_run.outputs
    leaked = {}
    for root in (home, server.store.parent):  # state, records, logs, checkpoints; the server's store
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink() and (found := tracked_leaks(path.read_bytes())):
                leaked[str(path.relative_to(root.parent))] = found
    assert leaked == {}
    for name, result in outputs.results.items():
        assert tracked_leaks((result.stdout + result.stderr).encode()) == [], name

    # What was searched is what the issue found the secrets in: everything ran and was written.
    for name, result in outputs.results.items():
        assert result.returncode == 0, (name, result.stderr[-3000:])
    (record,) = RunStore(home / "runs").list()
    assert record.status == COMPLETED
    registration = json.loads((Path(record.outputs["registration"]) / "registration.json").read_text())
    assert registration["registered_version"] == "1", registration["decision"]
    assert registration["task"]["options"] == {"api_token": "***", "hidden_width": 8}
    # MLflow reached the server (it printed its links, with the host and no user info) in the train and
    # register steps and `retrain train`, and the model's files are in the server's artifact store.
    link = f" at: http://127.0.0.1:{server.port}/#/experiments/"
    for step in ("train", "register"):
        assert link in Path(record.step(step).log).read_text(), step
    for name in ("train", "train on two processes"):
        assert link in outputs.results[name].stdout, name
    assert list(server.artifacts.rglob("MLmodel")) and list(server.artifacts.rglob("model.pt"))
    for checkpoints in ("checkpoints", "trained-checkpoints", "trained-2-checkpoints"):
        assert list((home / checkpoints).rglob("*.pt")), checkpoints


def test_no_process_the_product_starts_carries_a_secret_on_its_command_line(tracked_run):
    tables = sorted(tracked_run.tables.iterdir())
    builders = {}  # each process that built the task: its own command line
    shown = []
    for table in tables:
        builder = int(table.name.split("-")[0])
        for line in table.read_bytes().splitlines():
            pid, _, command = line.partition(b" ")
            if int(pid) == tracked_run.pids["train on two processes"]:
                continue  # the user's own command line: the token is on it because they typed it there
            if int(pid) == builder:
                builders[builder] = command.decode(errors="replace")
            if tracked_leaks(command):
                shown.append(command.decode(errors="replace"))
    assert shown == []
    commands = " | ".join(builders.values())
    # The task was built in the preflight, every step that needs it, and both torchrun workers.
    for seen in ("check-model", " prepare ", " train ", " evaluate ", " register ", "training.engine.worker"):
        assert seen in commands, (seen, commands)
    assert sum("training.engine.worker" in command for command in builders.values()) >= 3, commands
