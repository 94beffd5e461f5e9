"""`retrain train`: validate once, then run the worker in this process or under torchrun.

With `--nproc 1` the worker runs in-process. With more, torchrun starts one worker per process
(`--standalone`, gloo on CPU, NCCL on GPU) and this launcher forwards SIGTERM/SIGINT to it. torchrun
itself exits non-zero when it is signalled, whatever its workers did, so the launcher reads the outcome
from durable state: if the newest committed checkpoint is a preemption save of this launch, the run was
preempted and the launcher exits with the documented code.

The task is loaded here once, before any process starts, so that a task that does not load, or lacks a
part of the contract, is one line and no torchrun; each worker then loads it again for its own rank.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from training.checkpoint.records import REASON_PREEMPTED, CheckpointRecord
from training.checkpoint.stores import newest_record, open_checkpoint_store
from training.engine.batch_split import per_rank_batch_size
from training.engine.config import TrainConfig
from training.engine.preemption import LAUNCH_ID_VARIABLE, PREEMPTED_EXIT_CODE
from training.engine.resume_policy import check_resumable
from training.engine.train_args import config_to_argv
from training.errors import InputError

log = logging.getLogger(__name__)

_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def torchrun_command(config: TrainConfig, nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "training.engine.worker",
        *config_to_argv(config),
    ]


def _newest_record(config: TrainConfig, environ: Mapping[str, str]) -> CheckpointRecord | None:
    return newest_record(open_checkpoint_store(config.checkpoints, environ))


def load_checked_task(config: TrainConfig) -> Any:
    """The task `config` names, loaded and checked against the contract (this imports torch)."""
    from training.tasks.loader import load_task

    return load_task(config.task, config.task_options)


def refuse_incompatible_resume(config: TrainConfig, environ: Mapping[str, str], task: Any) -> None:
    """Refuse, in one line and before any process starts, a resume every worker would refuse."""
    record = _newest_record(config, environ)
    if record is not None:
        # The task reads the data version (and checks the data) only when there is a resume to check.
        check_resumable(record, config, task.load(config.data).data_version)


def preempted_in_launch(config: TrainConfig, launch_id: str, environ: Mapping[str, str]) -> bool:
    """Whether the newest committed checkpoint is a preemption save written by this launch."""
    record = _newest_record(config, environ)
    return record is not None and record.reason == REASON_PREEMPTED and record.launch_id == launch_id


def _run_torchrun(command: list[str], environ: Mapping[str, str]) -> int:
    process = subprocess.Popen(command, env=dict(environ))

    def forward(signum: int, _frame: object) -> None:
        process.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED_SIGNALS}
    try:
        return process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def launch(config: TrainConfig, nproc: int, environ: Mapping[str, str]) -> int:
    if nproc < 1:
        raise InputError(f"--nproc {nproc}: expected a positive number of processes")
    per_rank_batch_size(config.global_batch_size, nproc)  # refuse before starting any process
    task = load_checked_task(config)
    launch_id = uuid.uuid4().hex[:12]
    if nproc == 1:
        # Imported here: importing training.engine.launch (and `retrain`) must not pay for torch.
        from training.engine.worker import run_worker

        return run_worker(config, launch_id, environ, task)
    refuse_incompatible_resume(config, environ, task)
    from training.engine.saving import refuse_unfit_checkpoint_location  # torch: loaded with the task

    refuse_unfit_checkpoint_location(config, environ, task)
    # One intra-op thread per worker: N workers on N cores, not N x N threads fighting for them.
    environment = {"OMP_NUM_THREADS": "1", **environ, LAUNCH_ID_VARIABLE: launch_id}
    code = _run_torchrun(torchrun_command(config, nproc), environment)
    if code != 0 and preempted_in_launch(config, launch_id, environ):
        log.warning("training was preempted; run the same command again to resume")
        return PREEMPTED_EXIT_CODE
    return code
