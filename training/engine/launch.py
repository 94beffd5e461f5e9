"""`retrain train`: validate once, then run the worker in this process or under torchrun.

With `--nproc 1` the worker runs in-process. With more, torchrun starts one worker per process
(`--standalone`, gloo on CPU, NCCL on GPU) and this launcher forwards SIGTERM/SIGINT to it. torchrun
itself exits non-zero when it is signalled, whatever its workers did, so the launcher reads the outcome
from durable state: if the newest committed checkpoint is a preemption save of this launch, the run was
preempted and the launcher exits with the documented code. Any other failure is told by torchrun's error
file, which this launcher names: torchrun copies the first failed worker's report there
(training/engine/failure_report.py), and the launcher prints its one line and exits with its code: 65 for
a divergence (training/engine/divergence.py), 2 for a bad input or a task that breaks its contract, 1 for a
crash (whose traceback `retrain -v train` logs). torchrun's own traceback is never shown.

No worker outlives this launcher. torchrun runs as training.engine.torchrun_agent, which the kernel
kills when the launcher dies; each worker, whose parent torchrun is, then sees its parent gone and saves at
the agreed step and exits within 10 s (training/engine/parent_watch.py). That covers every way the
launcher can die, SIGKILL and the OOM killer included. While torchrun runs, the launcher is a child
subreaper, so workers orphaned by torchrun's own death come back to it, and on every way out of the
launcher that runs code (return, exception, a forwarded signal) whatever torchrun left behind is ended:
SIGTERM to each remaining process group, SIGKILL 10 s later (training/engine/process_tree.py). If torchrun
alone was killed and its workers saved a preemption checkpoint, `retrain train` exits with 75.

The task is loaded here once, before any process starts, so that a task that does not load, or lacks a
part of the contract, is one line and no torchrun; each worker then loads it again for its own rank.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.flags import config_to_argv
from core.secrets import tracking_credentials_apart
from core.task_ref import task_secrets_environment
from core.warm_start import warm_start_setting
from training.checkpoint.open_store import newest_record, open_checkpoint_lease, open_checkpoint_store
from training.checkpoint.records import REASON_PREEMPTED, CheckpointRecord
from training.engine.batch_split import micro_batch_size
from training.engine.config import TrainConfig
from training.engine.divergence import DIVERGED_EXIT_CODE, TrainingDiverged
from training.engine.failure_report import WorkerFailed, read_report
from training.engine.parent_watch import (
    PARENT_LOSS_DEADLINE_SECONDS,
    PARENT_PID_VARIABLE,
    set_child_subreaper,
)
from training.engine.preemption import ELASTIC_ERROR_FILE_VARIABLE, LAUNCH_ID_VARIABLE, PREEMPTED_EXIT_CODE
from training.engine.process_tree import children, end_descendants
from training.engine.resume_policy import check_resumable

log = logging.getLogger(__name__)

_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Workers left behind get SIGTERM, then SIGKILL after this: time for their own deadline to end them first.
LEFTOVER_GRACE_SECONDS = PARENT_LOSS_DEADLINE_SECONDS


def torchrun_command(config: TrainConfig, nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "training.engine.torchrun_agent",  # torchrun, dying with this launcher
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "training.engine.worker",
        *config_to_argv(config),
    ]


def _newest_record(config: TrainConfig, environ: Mapping[str, str]) -> CheckpointRecord | None:
    return newest_record(open_checkpoint_store(config.checkpoints, environ))


def load_checked_task(config: TrainConfig) -> Any:
    """The task `config` names, loaded and checked against the contract (this imports torch), and against
    the early-stopping metric: one the task does not declare is refused before any process starts."""
    from training.engine.validation import rule_for
    from training.tasks.loader import load_task

    task = load_task(config.task, config.task_options)
    rule_for(config, task)
    return task


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


def _start_torchrun(command: list[str], environ: Mapping[str, str], config: TrainConfig, warm: bool) -> Any:
    """torchrun's agent, forked from this process once it has imported what the workers need (they are
    forked from the agent in turn: training/warm/), instead of three fresh interpreters importing torch
    each. This process has loaded the task already; the workers import it afresh. Exec'd as it is with
    warm starts off (RETRAIN_WARM_START, core/warm_start.py; the agent then execs its workers too), and
    when this process runs threads of its own, which a fork would not carry."""
    if not warm or threading.active_count() > 1:
        return subprocess.Popen(command, env=dict(environ))
    from training.tasks.loader import user_task_modules
    from training.warm.forked import ForkedProcess, module_command
    from training.warm.preload import preload, worker_modules

    agent = module_command(command)
    assert agent is not None, command  # torchrun_command's: `python -m training.engine.torchrun_agent`
    preload(worker_modules(tracking=bool(config.mlflow_tracking_uri)))
    module, arguments, _ = agent
    forget = user_task_modules(config.task)
    return ForkedProcess(
        module, arguments, env=environ, cwd=os.getcwd(), new_session=False, forget_modules=forget
    )


def _run_torchrun(
    command: list[str], environ: Mapping[str, str], config: TrainConfig, warm: bool
) -> tuple[int, bool]:
    """torchrun's exit code, and whether an eviction notice (SIGTERM/SIGINT) was forwarded to it."""
    # A subreaper while torchrun runs: workers orphaned by torchrun's death come back here, to be ended.
    subreaper = set_child_subreaper(True)
    others = children(os.getpid())  # whatever else this process started is not torchrun's to end
    process = _start_torchrun(command, {**environ, PARENT_PID_VARIABLE: str(os.getpid())}, config, warm)

    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        process.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED_SIGNALS}
    try:
        return process.wait(), bool(forwarded)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        try:
            # Normally torchrun has ended its workers and nothing is left. On the other ways out (an
            # exception, a second Ctrl-C, torchrun killed) its workers' sessions would live on without it.
            end_descendants(LEFTOVER_GRACE_SECONDS, spare=others)
            process.poll()
        finally:
            if subreaper:
                set_child_subreaper(False)


def launch(config: TrainConfig, nproc: int, environ: Mapping[str, str]) -> int:
    if nproc < 1:
        raise InputError(f"--nproc {nproc}: expected a positive number of processes")
    warm = warm_start_setting(environ)  # a value it does not know is refused before anything starts
    # Refused before starting any process:
    micro_batch_size(config.global_batch_size, nproc, config.accumulate_grad_batches)
    task = load_checked_task(config)
    launch_id = uuid.uuid4().hex[:12]
    if nproc == 1:
        # Imported here: importing training.engine.launch (and `retrain`) must not pay for torch.
        from training.engine.worker import run_worker

        return run_worker(config, launch_id, environ, task)
    refuse_incompatible_resume(config, environ, task)
    # A location another attempt holds is refused here in one line, not by rank 0 under torchrun's traceback;
    # rank 0's own lease, taken again once the workers start, is the guarantee.
    open_checkpoint_lease(config.checkpoints, environ, launch_id).acquire().release()
    from training.checkpoint.estimate import refuse_unfit_checkpoint_location  # torch: loaded with the task

    refuse_unfit_checkpoint_location(config, environ, task)
    # A password in the tracking URI goes to the workers in MLflow's variables, and a task secret in
    # RETRAIN_TASK_SECRETS, never on their command line (readable by every user of the machine), where the
    # task options stand as written (core/task_ref.py).
    tracking_uri, credentials = tracking_credentials_apart(config.mlflow_tracking_uri or "")
    credentials = {**credentials, **task_secrets_environment(config.task_options, environ)}
    command = torchrun_command(replace(config, mlflow_tracking_uri=tracking_uri or None), nproc)
    # One intra-op thread per worker: N workers on N cores, not N x N threads fighting for them.
    environment = {"OMP_NUM_THREADS": "1", **environ, **credentials, LAUNCH_ID_VARIABLE: launch_id}
    with tempfile.TemporaryDirectory(prefix="retrain-launch-") as reports:
        error_file = Path(reports) / "torchrun-error.json"  # this launch's alone: no older report speaks
        environment[ELASTIC_ERROR_FILE_VARIABLE] = str(error_file)
        code, noticed = _run_torchrun(command, environment, config, warm)
        report = read_report(error_file) if code != 0 else None
    if report is not None and report.code == DIVERGED_EXIT_CODE:
        raise TrainingDiverged(report.message)
    # A notice this launcher forwarded is honoured by every worker (exit 75) even when its save failed, which
    # they report; without one, a preemption save of this launch (torchrun itself killed) says the same.
    if code != 0 and (noticed or preempted_in_launch(config, launch_id, environ)):
        log.warning("training was preempted; run the same command again to resume")
        return PREEMPTED_EXIT_CODE
    if report is not None:
        # The failed worker's own line and code, as it would have said and exited without torchrun.
        if report.callstack:
            log.debug("the failed worker's traceback:\n%s", report.callstack)
        raise WorkerFailed(report.message, report.code or code)
    return code
