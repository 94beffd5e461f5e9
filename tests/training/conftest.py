"""Fixtures for training tests: a prepared data version, and real `retrain train` processes to follow."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from azure.storage.blob import ContainerClient
from helpers.training.overfitting import overfitting_arguments, prepare_overfitting_data
from helpers.training.small_run import NO_TRACKING, train_arguments
from helpers.training.training_process import kill_process_tree
from helpers.training.warm_training import WarmStarts

from core.files import write_atomically
from core.storage.local import exclusive_file_lock
from training.checkpoint.blob_store import BlobCheckpointStore
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.store_protocol import CheckpointStore
from training.engine.supervise import TrainingProcess
from training.tasks.tabular.manifest import Manifest
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.sample_data import write_sample_batches


@pytest.fixture(params=["local", "blob"])
def inner_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    """An empty checkpoint store: a local folder, then an Azurite container prefix."""
    if request.param == "local":
        yield LocalCheckpointStore(tmp_path / "ckpt")
        return
    container: ContainerClient = request.getfixturevalue("azurite").new_container()
    yield BlobCheckpointStore(container, "run")
    container.delete_container()


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_sample_batches(root / "raw", batches=4)
    prepare(root / "raw", root / "prepared")
    return root / "prepared"


@dataclass
class RunFolders:
    checkpoints: str
    out: Path
    logs: Path


@pytest.fixture
def folders(tmp_path: Path) -> RunFolders:
    return RunFolders(checkpoints=str(tmp_path / "checkpoints"), out=tmp_path / "out", logs=tmp_path / "logs")


StartTraining = Callable[..., TrainingProcess]


@pytest.fixture(scope="session")
def warm_starts() -> Iterator[WarmStarts]:
    """`retrain train` forked from one warm starter per test process (helpers/training/warm_training.py)."""
    starts = WarmStarts(Path.cwd(), dict(os.environ))
    yield starts
    starts.close()


def _small_runs(
    prepared_data: Path, folders: RunFolders, warm_starts: WarmStarts | None
) -> Iterator[StartTraining]:
    started: list[TrainingProcess] = []
    folders.logs.mkdir(parents=True, exist_ok=True)

    def start(
        nproc: int = 2,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        tracking: Sequence[str] = NO_TRACKING,
    ) -> TrainingProcess:
        log_file = (folders.logs / f"attempt-{len(started) + 1}.log").open("w")
        locations = train_arguments(prepared_data, folders.out, folders.checkpoints, nproc)
        arguments = [*locations, *tracking, *extra]
        environ = {**os.environ, **(env or {})}
        if warm_starts is None:
            process = TrainingProcess(arguments, env=environ, stderr=log_file)
        else:
            process = warm_starts.training(arguments, env=environ, stderr=log_file)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.process.poll() is None:
            kill_process_tree(process)


@pytest.fixture
def start_training(
    prepared_data: Path, folders: RunFolders, warm_starts: WarmStarts
) -> Iterator[StartTraining]:
    """Start `retrain train` on the small run, forked warm; its stderr goes to a log file shown if a test
    fails."""
    yield from _small_runs(prepared_data, folders, warm_starts)


@pytest.fixture
def start_fresh_training(prepared_data: Path, folders: RunFolders) -> Iterator[StartTraining]:
    """As `start_training`, each in a fresh interpreter, as an operator's shell starts it: for the tests of
    the launcher's own process tree."""
    yield from _small_runs(prepared_data, folders, None)


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
    """Where the registry tests' untracked models are trained once per session
    (tests/helpers/training/registry_harness.py)."""
    return tmp_path_factory.mktemp("trained-models")


@pytest.fixture(scope="session")
def overfitting_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data version the small tabular model overfits (tests/helpers/training/overfitting.py)."""
    return prepare_overfitting_data(tmp_path_factory.mktemp("overfitting"))


@pytest.fixture
def start_overfitting(
    overfitting_data: Path, tmp_path: Path, warm_starts: WarmStarts
) -> Iterator[Callable[..., TrainingProcess]]:
    """Start the overfitting run on `nproc` processes (default 2) into `tmp_path/<name>/` (its out/ and
    checkpoints/); the same name is the same run, restarted; `tracking`: its MLflow flags (default: none).
    Whatever is still running at the end is killed, whole."""
    started: list[TrainingProcess] = []

    def start(name: str, tracking: Sequence[str] = NO_TRACKING, nproc: int = 2) -> TrainingProcess:
        root = tmp_path / name
        root.mkdir(exist_ok=True)
        arguments = overfitting_arguments(
            overfitting_data, root / "out", root / "checkpoints", nproc=nproc, tracking=tracking
        )
        log_file = (root / f"attempt-{len(started) + 1}.log").open("w")
        process = warm_starts.training(arguments, stderr=log_file)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.process.poll() is None:
            kill_process_tree(process)
