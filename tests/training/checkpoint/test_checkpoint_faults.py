"""Storage faults (issue 14, item 3): a checkpoint location that fills up mid-run costs neither the model
nor a word, and one that cannot take checkpoints is refused before the first step.

Where this process may mount file systems (root with CAP_SYS_ADMIN, as in the project's container) the
disks are real tmpfs mounts. Where it may not, the filling run uses a real store whose writes, once the
"disk" is full, go to /dev/full, so the kernel itself answers ENOSPC through the real file API; and the
too-small refusal is checked against the real free space of the test's own file system.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.training.filling_disk import FillingStore, can_mount, fill_up, obey_file_modes_as_root, tmpfs

from core.errors import CheckpointError
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.free_space import check_room
from training.checkpoint.lease import LEASE_NAME
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import CheckpointMeta
from training.checkpoint.store_protocol import CheckpointStore
from training.cli import main
from training.engine.distributed import init_distributed
from training.engine.preemption import PREEMPTED_EXIT_CODE, PreemptionNotice
from training.engine.progress import LogRenderer
from training.engine.tracking import make_tracker
from training.engine.train_args import add_train_arguments, config_from_args
from training.engine.trainer import COMPLETED, Trainer
from training.engine.worker import run_worker
from training.tasks.loader import load_task

STEPS = 44  # one epoch of the small data at a global batch of 32: saves at 10, 20, 30, 40, and the final 44
RUN = [
    "--epochs", "1", "--global-batch-size", "32", "--task-option", "hidden_width=64", "--seed", "7",
    "--checkpoint-every-steps", "10", "--checkpoint-every-seconds", "off", "--no-mlflow",
]  # fmt: skip


def _config(prepared_data: Path, tmp_path: Path, checkpoints: Path, *extra: str, run: list[str] = RUN):
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    places = ["--data", str(prepared_data), "--out", str(tmp_path / "out"), "--checkpoints", str(checkpoints)]
    return config_from_args(parser.parse_args([*places, *run, *extra]), {}, tmp_path)


class FillOnFirstCheckpoint(logging.Handler):
    """Fills the disk when the progress log announces the first durable checkpoint. The renderer logs from
    the training loop itself, so the disk is full before training takes another step."""

    def __init__(self, fill: Callable[[], None]) -> None:
        super().__init__(logging.INFO)
        self._fill = fill
        self.filled = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.filled and re.match(
            r"checkpoint step-\d+-a\d+ \(interval\) durable", record.getMessage()
        ):
            self.filled = True
            self._fill()


def _train_in_process_on(store: FillingStore, config: Any) -> int:
    """What `run_worker` does on one process, exit code included, with the store given."""
    checkpointer = Checkpointer(store, keep_last=config.keep_checkpoints)
    task = load_task(config.task, config.task_options)
    notice = PreemptionNotice().install()
    tracker = make_tracker(config.mlflow_tracking_uri, config.mlflow_experiment, None, is_primary=True)
    trainer = Trainer(
        config, init_distributed("cpu", {}), task, task.load(config.data), checkpointer, tracker,
        LogRenderer(), launch_id="fills", notice=notice,
    )  # fmt: skip
    try:
        return 0 if trainer.run().status == COMPLETED else PREEMPTED_EXIT_CODE
    finally:
        checkpointer.close()
        notice.uninstall()


@dataclass
class FilledRun:
    code: int
    left: list[str]  # what the checkpoint folder holds afterwards, the filler aside
    newest: str | None  # the newest checkpoint that verifies
    failures: list[str]  # the log lines reporting a failed save


def _run_on_a_disk_that_fills_up(
    config: Any, caplog: pytest.LogCaptureFixture, then: Callable[[], None] = lambda: None
) -> FilledRun:
    """Train on checkpoints whose disk fills up once the first one is durable (then calls `then`)."""
    checkpoints = Path(config.checkpoints)
    caplog.set_level(logging.INFO)
    progress = logging.getLogger("retrain.progress")
    with ExitStack() as stack:
        if can_mount():  # a real 1 MiB disk: room for the checks before training, then filled by another file
            stack.enter_context(tmpfs(checkpoints, "size=1m"))
            fill: Callable[[], None] = lambda: fill_up(checkpoints)  # noqa: E731
        else:
            store = FillingStore(LocalCheckpointStore(checkpoints))
            fill = store.fill_up
        hook = FillOnFirstCheckpoint(lambda: (fill(), then()))
        progress.addHandler(hook)
        stack.callback(progress.removeHandler, hook)
        code = run_worker(config, "fills", {}) if can_mount() else _train_in_process_on(store, config)
        left = sorted(name for name in os.listdir(checkpoints) if name not in ("filler", LEASE_NAME))
        newest = Checkpointer(LocalCheckpointStore(checkpoints)).newest_valid()
    assert hook.filled
    # Each failed save is reported once, with the operating system's reason and the location.
    failed_save = re.compile(r"checkpoint at step (\d+) was not saved")
    failures = [line for line in caplog.messages if failed_save.search(line)]
    steps = [int(failed_save.search(line).group(1)) for line in failures]
    assert not any("enforce fail" in line for line in caplog.messages)
    assert len(set(steps)) == len(steps) >= 1
    assert all(f"was not saved: no space left on device on {checkpoints};" in line for line in failures)
    assert all(line.endswith("tries again at the next interval") for line in failures[:-1])
    # Nothing partial: no temp file, no data without its record.
    assert not [name for name in left if name.startswith(".")]
    stems = {name.rsplit(".", 1)[0] for name in left}
    assert left == sorted([f"{stem}.json" for stem in stems] + [f"{stem}.pt" for stem in stems])
    return FilledRun(code, left, newest.record.name if newest else None, failures)


def test_a_disk_that_fills_up_mid_run_keeps_the_model_and_reports_every_failed_save_once(
    prepared_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = tmp_path / "ckpt"
    config = _config(prepared_data, tmp_path, checkpoints, "--progress", "log")
    run = _run_on_a_disk_that_fills_up(config, caplog)

    assert run.code == 0 and (config.out / "model.pt").is_file()
    metadata = json.loads((config.out / "metadata.json").read_text())
    summary, warnings = metadata["checkpoints"], metadata["warnings"]
    assert run.failures[-1] == (
        f"the final checkpoint at step {STEPS} was not saved: no space left on device on {checkpoints}; "
        f"the model is still written to {config.out}"
    )
    # The disk stayed full, so every save after the first failure failed, and the metadata says so.
    assert summary["failed"] == summary["failed_since_last_saved"] == len(run.failures)
    assert summary["saved"] >= 1 and run.newest is not None and summary["last_saved"] == run.newest
    assert summary["last_failure"] == f"no space left on device on {checkpoints}"
    assert warnings == [
        f"the last {len(run.failures)} checkpoint save(s) failed (no space left on device on {checkpoints}); "
        f"the model in {config.out} is complete, but a run resumed from {checkpoints} starts from checkpoint "
        f"{run.newest}"
    ]
    assert warnings[0] in caplog.messages


def test_a_save_that_failed_mid_run_is_in_the_runs_summary_not_only_in_the_log(
    prepared_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 41: the save at step 20 fails (its disk is full for it alone), the later ones are durable. The
    run's summary says so: metadata.json (which save, why, and a warning), the `done` line, and the MLflow
    run's tag; not only the warning in the train log."""
    checkpoints = tmp_path / "ckpt"
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracked = [each for each in RUN if each != "--no-mlflow"]
    extra = ["--progress", "log", "--mlflow-tracking-uri", tracking]
    config = _config(prepared_data, tmp_path, checkpoints, *extra, run=tracked)
    full_for_20 = FillingStore(
        LocalCheckpointStore(checkpoints), fails=lambda name: name.startswith("step-0000000020-")
    )
    full_for_20.fill_up()
    caplog.set_level(logging.INFO)
    assert _train_in_process_on(full_for_20, config) == 0

    failure = f"no space left on device on {checkpoints}"
    metadata = json.loads((config.out / "metadata.json").read_text())
    summary = metadata["checkpoints"]
    assert (summary["saved"], summary["failed"], summary["failed_since_last_saved"]) == (4, 1, 0)
    assert summary["not_saved"] == [{"step": 20, "reason": "interval", "failure": failure, "refused": False}]
    assert metadata["warnings"] == [
        f"1 earlier checkpoint save(s) at step(s) 20 failed ({failure}); the saves after them in "
        f"{checkpoints} are durable"
    ]
    done = [line for line in caplog.messages if line.startswith("done: ")]
    assert len(done) == 1 and done[0].endswith("; checkpoints not saved: step 20 (metadata.json says why)")
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking).get_run(metadata["mlflow_run_id"])
    assert run.data.tags["retrain.checkpoints_not_saved"] == "step 20"


def test_an_eviction_whose_save_fails_still_exits_preempted_and_says_where_a_restart_resumes(
    prepared_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = tmp_path / "ckpt"
    config = _config(prepared_data, tmp_path, checkpoints, "--progress", "log")
    # The eviction notice arrives as the disk fills: the save at the agreed step fails.
    run = _run_on_a_disk_that_fills_up(config, caplog, then=lambda: os.kill(os.getpid(), signal.SIGTERM))

    assert run.code == PREEMPTED_EXIT_CODE and not config.out.exists()
    step = int(re.search(r"at step (\d+)", run.failures[-1]).group(1))
    assert run.failures[-1] == (
        f"the preempted checkpoint at step {step} was not saved: no space left on device on {checkpoints}; "
        f"a restart resumes from checkpoint {run.newest}"
    )
    assert (
        f"preempted at step {step}, whose state was not saved: a restart resumes from checkpoint "
        f"{run.newest}; exiting with code {PREEMPTED_EXIT_CODE}"
    ) in caplog.messages


# -- the checkpointer on a full disk, both stores -------------------------------------------------------


def _meta(step: int) -> CheckpointMeta:
    return CheckpointMeta(
        step=step, epoch=0, position=step, reason="interval", attempt=1, launch_id="t", world_size=1,
        data_version="dv",
    )  # fmt: skip


def _state() -> dict:
    import torch

    return {"model": {"weight": torch.ones(256, 256)}}


def test_a_save_on_a_full_disk_fails_with_the_reason_and_leaves_nothing(inner_store: CheckpointStore) -> None:
    store = FillingStore(inner_store)
    checkpointer = Checkpointer(store)
    checkpointer.save(_state(), _meta(10))
    assert checkpointer.wait_until_durable().record is not None
    store.fill_up()
    checkpointer.save(_state(), _meta(20))
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    assert result.record is None and result.failure == f"no space left on device on {store.location}"
    assert inner_store.names() == ["step-0000000010-a001.json", "step-0000000010-a001.pt"]
    assert inner_store.discard_incomplete() == 0  # the store removed the partial file itself
    assert (checkpointer.stats.failed, checkpointer.stats.failed_since_last_saved) == (1, 1)
    checkpointer.close()


def test_data_whose_record_failed_is_removed_with_any_left_by_a_crash(inner_store: CheckpointStore) -> None:
    with inner_store.writer("step-0000000005-a000.pt") as crashed:  # a save killed before its record
        crashed.write(b"x" * 1000)
    store = FillingStore(inner_store, fails=lambda name: name.endswith(".json"))
    store.fill_up()
    checkpointer = Checkpointer(store)
    checkpointer.save(_state(), _meta(10))
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    assert result.record is None and "no space left on device" in result.failure
    assert inner_store.names() == []  # its data went, and so did the crash's leftover
    checkpointer.close()


def test_at_start_up_data_left_without_its_record_is_removed_and_checkpoints_are_kept(
    inner_store: CheckpointStore,
) -> None:
    checkpointer = Checkpointer(inner_store)
    checkpointer.save(_state(), _meta(10))
    checkpointer.wait_until_durable()
    with inner_store.writer("step-0000000020-a001.pt") as crashed:  # killed before its record
        crashed.write(b"x" * 1000)
    assert checkpointer.discard_uncommitted() == 1
    assert inner_store.names() == ["step-0000000010-a001.json", "step-0000000010-a001.pt"]
    checkpointer.close()


# -- refused before training ----------------------------------------------------------------------------


def _arguments(prepared_data: Path, out: Path, checkpoints: Path, nproc: int) -> list[str]:
    places = ["--data", str(prepared_data), "--out", str(out), "--checkpoints", str(checkpoints)]
    return ["train", "--nproc", str(nproc), *places, *RUN]


def _refused_by_the_command(arguments: list[str], out: Path) -> str:
    """`retrain train` as a user runs it; returns its one error line after checking nothing was trained."""
    result = subprocess.run(
        [sys.executable, "-m", "training.cli", *arguments, "--progress", "jsonl"],
        capture_output=True, text=True, env=dict(os.environ),
        preexec_fn=obey_file_modes_as_root if os.geteuid() == 0 else None,
    )  # fmt: skip
    assert result.stdout.strip() == ""  # not even the "start" event
    return _one_error_line(result.returncode, result.stderr, out)


def _refused_in_process(arguments: list[str], out: Path, capsys, caplog) -> str:
    """The same command in this process (cheaper: torch is loaded already)."""
    caplog.set_level(logging.INFO)
    code = main([*arguments, "--progress", "log"])
    assert not [record for record in caplog.records if record.name == "retrain.progress"]  # no "start"
    return _one_error_line(code, capsys.readouterr().err, out)


def _one_error_line(code: int, stderr: str, out: Path) -> str:
    errors = [line for line in stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert code == 2 and len(errors) == 1, stderr[-3000:]
    assert errors[0].startswith("retrain: error: "), errors[0]
    assert not out.exists()
    return errors[0]


def test_a_read_only_checkpoint_location_is_refused_before_training(
    prepared_data: Path, tmp_path: Path, capsys, caplog
) -> None:
    def refused(checkpoints: Path, nproc: int, in_process: bool) -> str:
        out = tmp_path / f"out-{checkpoints.name}"
        arguments = _arguments(prepared_data, out, checkpoints, nproc)
        if in_process:
            return _refused_in_process(arguments, out, capsys, caplog)
        return _refused_by_the_command(arguments, out)

    def read_only_folder(name: str) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name).chmod(0o555)
        return tmp_path / name

    def expected(checkpoints: Path, reason: str) -> str:
        # The lease, taken first, is the first write: either line names the folder and the reason.
        folder = re.escape(str(checkpoints))
        return (
            rf"(test write before training failed: .*{folder}"
            rf"|cannot open checkpoint lease file {folder}/\.lease): {reason}; expected"
        )

    # The whole command on one process: the worker's check.
    folder = read_only_folder("ckpt-folder")
    assert re.search(expected(folder, "Permission denied"), refused(folder, nproc=1, in_process=False))
    # On two: the launcher's check, before torchrun starts.
    if can_mount():
        with tmpfs(tmp_path / "ckpt-mount", "ro,size=1m") as mount:
            line = refused(mount, nproc=2, in_process=True)
        assert re.search(expected(mount, "Read-only file system"), line)
    else:  # root ignores a folder's mode bits in this process, but not in a child that dropped the capability
        folder = read_only_folder("ckpt-folder-2")
        line = refused(folder, nproc=2, in_process=os.geteuid() != 0)
        assert re.search(expected(folder, "Permission denied"), line)
    assert not [path for path in tmp_path.glob("ckpt-*/*")]


def test_a_checkpoint_location_without_room_for_its_checkpoints_is_refused_before_training(
    prepared_data: Path, tmp_path: Path, capsys, caplog
) -> None:
    def expected(checkpoints: Path, basis: str) -> str:
        size = r"[0-9.]+ [MG]B"
        return (
            rf"checkpoint location {re.escape(str(checkpoints))} has {size} free; expected room for 3 "
            rf"checkpoints of about {size} each \({size}; {basis}\) before training starts"
        )

    if not can_mount():
        # No small disk to be had: the same check against the real free space of this file system.
        store = LocalCheckpointStore(tmp_path / "ckpt")
        with pytest.raises(CheckpointError, match=expected(tmp_path / "ckpt", "as big as the free space")):
            check_room(store, store.free_bytes(), "as big as the free space", keep_last=2)
        assert store.names() == []
        return
    for nproc in (1, 2):  # the worker's check, and the launcher's before torchrun starts
        checkpoints, out = tmp_path / f"ckpt-{nproc}", tmp_path / f"out-{nproc}"
        with tmpfs(checkpoints, "size=128k"):
            line = _refused_in_process(
                _arguments(prepared_data, out, checkpoints, nproc), out, capsys, caplog
            )
            assert os.listdir(checkpoints) == [LEASE_NAME]  # the lease's file, released: no checkpoint
        assert re.search(expected(checkpoints, "estimated from the model and its optimizer"), line)
