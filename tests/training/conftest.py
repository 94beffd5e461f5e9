"""Fixtures for training tests: a prepared data version, and real `retrain train` processes to follow."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from core.files import write_atomically
from core.storage.local import exclusive_file_lock
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import RECORD_SUFFIX, CheckpointRecord, committed_checkpoints
from training.engine.supervise import TrainingProcess
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.sample_data import write_sample_batches
from training.tasks.tabular.schema import Manifest

# A small model and two short epochs: 1421 training rows / 32 = 44 steps per epoch, 88 steps in all, room
# for two kills mid-interval and mid-epoch (checkpoints every 10 steps) and a restart.
STEPS_PER_EPOCH = 44
TOTAL_STEPS = 2 * STEPS_PER_EPOCH
SMALL_RUN = [
    "--epochs", "2", "--global-batch-size", "32", "--task-option", "hidden_width=64", "--seed", "7",
    "--checkpoint-every-steps", "10", "--checkpoint-every-seconds", "off", "--deterministic",
]  # fmt: skip
NO_TRACKING = ("--no-mlflow",)


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_sample_batches(root / "raw", batches=4)
    prepare(root / "raw", root / "prepared")
    return root / "prepared"


def is_step(at_least: int) -> Callable[[dict], bool]:
    return lambda event: event["event"] == "step" and event["step"] >= at_least


def is_checkpoint(step: int) -> Callable[[dict], bool]:
    return lambda event: event["event"] == "checkpoint" and event["step"] == step


def resumed_event(process: TrainingProcess) -> dict:
    return next(event for event in process.events_seen if event["event"] == "resumed")


def newest_record(checkpoints: str) -> CheckpointRecord:
    store = LocalCheckpointStore(Path(checkpoints))
    name = committed_checkpoints(store.names())[0]
    return CheckpointRecord.from_bytes(store.read(name + RECORD_SUFFIX), name)


def train_arguments(data: Path, out: Path, checkpoints: str | Path, nproc: int) -> list[str]:
    """`retrain train` arguments for the small run."""
    locations = ["--data", str(data), "--out", str(out), "--checkpoints", str(checkpoints)]
    return ["--nproc", str(nproc), *locations, *SMALL_RUN]


def read_metadata(out: Path) -> dict:
    return json.loads((out / "metadata.json").read_text())


def kill_process_tree(process: TrainingProcess) -> None:
    """SIGKILL the launcher, torchrun and every worker at once, as losing the node would."""
    root = psutil.Process(process.pid)
    everyone = [root, *root.children(recursive=True)]
    for member in everyone:
        member.send_signal(signal.SIGKILL)
    psutil.wait_procs(everyone)
    process.process.wait()


@dataclass
class RunFolders:
    checkpoints: str
    out: Path
    logs: Path


@pytest.fixture
def folders(tmp_path: Path) -> RunFolders:
    return RunFolders(checkpoints=str(tmp_path / "checkpoints"), out=tmp_path / "out", logs=tmp_path / "logs")


StartTraining = Callable[..., TrainingProcess]


@pytest.fixture
def start_training(prepared_data: Path, folders: RunFolders) -> Iterator[StartTraining]:
    """Start `retrain train` on the small run; its stderr goes to a log file shown if a test fails."""
    started: list[TrainingProcess] = []
    folders.logs.mkdir(parents=True, exist_ok=True)

    def start(
        nproc: int = 2,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        tracking: Sequence[str] = NO_TRACKING,
    ) -> TrainingProcess:
        log_file = (folders.logs / f"attempt-{len(started) + 1}.log").open("w")
        process = TrainingProcess(
            [*train_arguments(prepared_data, folders.out, folders.checkpoints, nproc), *tracking, *extra],
            env={**os.environ, **(env or {})},
            stderr=log_file,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.process.poll() is None:
            kill_process_tree(process)


@pytest.fixture(scope="session")
def uninterrupted_run(prepared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The reference: the small run on 2 processes, never interrupted. Trained once per test session, not
    once per xdist worker: the first worker to need it trains it under a lock, the others read its metadata
    (the prepared data, and so the run, are the same in every worker)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, not a worker's
    reference = shared / "uninterrupted-run-metadata.json"
    with exclusive_file_lock(shared / "uninterrupted-run.lock", f"pid {os.getpid()}"):
        if not reference.exists():
            root = tmp_path_factory.mktemp("uninterrupted")
            arguments = train_arguments(prepared_data, root / "out", root / "checkpoints", nproc=2)
            process = TrainingProcess([*arguments, *NO_TRACKING], stderr=(root / "stderr.log").open("w"))
            assert process.finish() == 0, (root / "stderr.log").read_text()[-3000:]
            write_atomically(reference, (root / "out" / "metadata.json").read_bytes())
    return json.loads(reference.read_text())


# Shared by test_prepare.py and test_schema.py: the sample raw batches, and a data version prepared from them
# once per test module.


@pytest.fixture(scope="module")
def sample_raw(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("sample") / "raw"
    write_sample_batches(raw, batches=4)
    return raw


@pytest.fixture(scope="module")
def prepared(sample_raw, tmp_path_factory) -> tuple[Manifest, Path]:
    out = tmp_path_factory.mktemp("prepared") / "v1"
    return prepare(sample_raw, out), out


@pytest.fixture(scope="session")
def trained_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the registry tests' untracked models are trained once per session (registry_harness.py)."""
    return tmp_path_factory.mktemp("trained-models")
