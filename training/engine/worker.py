"""One training process: what `torchrun -m training.engine.worker` (or Azure ML's launcher) starts per rank.

    torchrun --standalone --nproc_per_node=N -m training.engine.worker --data D --out O --checkpoints C ...

Exit codes:
- 0 completed;
- 75 preempted: the eviction notice was honoured and the state saved; start it again to resume;
- 65 diverged: a step's loss, or the weights its update left, were not finite; every rank stopped at that
  step, nothing was saved after it and no model written: lower the learning rate or check the data first;
- 2 bad input: a one-line error on stderr (also: another attempt held the checkpoint location past
  RETRAIN_LEASE_WAIT_SECONDS, or this attempt lost its lease on it);
- 1 a crash: the next start resumes from the last durable checkpoint.

Every way out but success also writes its code and one-line reason into the error file torchrun gives the
worker (TORCHELASTIC_ERROR_FILE, failure_report.py; a crash adds its traceback there, and prints none);
torchrun copies the first failed worker's into its own, which is how a launcher above torchrun
(`retrain train --nproc N`, the local runner) tells the user why, and tells a divergence or a preemption
from a crash. The worker prints its one-line error too, unless a `retrain train` launcher above torchrun
will (it prints it from torchrun's error file, after every worker has ended).

When the process that started the worker dies (torchrun, or `retrain train` and torchrun with it, killed
outright), the worker learns of it at once (parent_watch.py) and treats it as an eviction notice: the ranks
agree on a step, rank 0 saves a preempted checkpoint, and the worker exits with 75. If that has not
finished 10 s after it noticed (a peer is gone too, a collective hangs), it exits with 1; before it has
joined its process group, it exits with 1 at once. Either way no worker outlives its launcher.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from core.errors import RetrainError
from core.secrets import mask_logged_secrets, mask_secrets, mlflow_credentials_apart
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.lease import CheckpointLease, LeasedStore
from training.checkpoint.open_store import open_checkpoint_lease, open_checkpoint_store
from training.checkpoint.sharded import ShardGroup
from training.engine.config import TrainConfig
from training.engine.distributed import DistContext, barrier, init_distributed, shutdown_distributed
from training.engine.divergence import (
    DIVERGED_EXIT_CODE,
    Divergence,
    TrainingDiverged,
    report_divergence_to_launcher,
)
from training.engine.failure_report import report_to_launcher
from training.engine.heap import keep_freed_heap
from training.engine.parent_watch import ParentWatch, expected_parent
from training.engine.preemption import (
    LAUNCH_ID_VARIABLE,
    PREEMPTED_EXIT_CODE,
    PreemptionNotice,
    report_preemption_to_launcher,
)
from training.engine.progress import make_renderer
from training.engine.tracking import make_tracker
from training.engine.train_args import add_train_arguments, config_from_args
from training.engine.trainer import DIVERGED, PREEMPTED, Trainer
from training.tasks.base import Task
from training.tasks.loader import load_task

log = logging.getLogger("retrain.worker")

JOB_RUN_ID_VARIABLE = "MLFLOW_RUN_ID"  # set by Azure ML: the job's own MLflow run
CRASHED_EXIT_CODE = 1  # what Python exits with for an uncaught exception, and torchrun for a failed worker


def configure_numerics(deterministic: bool) -> None:
    # Subnormal floats (below ~1e-38, which Adam's second moments and decaying updates reach) make CPU
    # arithmetic several times slower; flushing them to zero changes nothing a model can notice.
    torch.set_flush_denormal(True)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def run_worker(
    config: TrainConfig,
    launch_id: str,
    environ: Mapping[str, str],
    task: Task | None = None,
    watch_parent: bool = False,
) -> int:
    """Train as this process's rank; returns the process exit code. `task`: already loaded (in-process).

    `watch_parent`: stop as if evicted when the process that started this one dies (parent_watch.py).
    """
    keep_freed_heap(environ)  # before the model and the data are allocated
    notice = PreemptionNotice().install()
    watch = ParentWatch(notice, expected_parent(environ)).start() if watch_parent else None
    context = init_distributed(config.device, environ)
    if watch is not None:
        watch.allow_save()
    lease: CheckpointLease | None = None
    try:
        configure_numerics(config.deterministic)
        task = task if task is not None else load_task(config.task, config.task_options)
        data = task.load(config.data)
        store = open_checkpoint_store(config.checkpoints, environ)
        if context.is_primary:
            # One writer per run, until its checkpointer is closed; other ranks wait at their next collective.
            lease = open_checkpoint_lease(config.checkpoints, environ, launch_id).acquire()
            store = LeasedStore(store, lease)
            store.discard_incomplete()  # safe only with no other writer: what the lease guarantees
        # Sharded layout: every rank writes its shard, its collectives on a gloo group of their own, made by
        # every rank here, in the same order.
        shards = ShardGroup.create(context.rank, context.world_size) if config.sharded_checkpoints else None
        checkpointer = Checkpointer(store, keep_last=config.keep_checkpoints, shards=shards)
        tracker = make_tracker(
            config.mlflow_tracking_uri,
            config.mlflow_experiment,
            config.mlflow_artifact_location,
            context.is_primary,
            job_run_id=environ.get(JOB_RUN_ID_VARIABLE),
        )
        renderer = make_renderer(config.progress, context.is_primary)
        try:
            trainer = Trainer(config, context, task, data, checkpointer, tracker, renderer, launch_id, notice)
            outcome = trainer.run()
        finally:
            checkpointer.close()
            renderer.close()
        if outcome.status == DIVERGED and outcome.divergence is not None:
            return leave_diverged(outcome.divergence, context, notice, environ)
        if outcome.status != PREEMPTED:
            return 0
        report_preemption_to_launcher(environ)
        return PREEMPTED_EXIT_CODE
    finally:
        if lease is not None:
            lease.release()
        shutdown_distributed()
        if watch is not None:
            watch.stop()
        notice.uninstall()


def leave_diverged(
    divergence: Divergence, context: DistContext, notice: PreemptionNotice, environ: Mapping[str, str]
) -> int:
    """Report the divergence to the launcher and leave with its code, the same on every rank.

    torchrun sends SIGTERM to the other workers as soon as one has exited, then names as the cause the
    failure whose report is oldest (to the second), copying that report with that worker's exit code. So
    every rank writes its report before any leaves (the barrier), and a rank signalled afterwards still
    leaves with this code instead of dying of the signal: there is nothing left for it to save.
    """
    report_divergence_to_launcher(environ, divergence)
    if context.is_distributed:
        notice.uninstall()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    barrier(context)
    if context.is_primary and LAUNCH_ID_VARIABLE not in environ:
        raise TrainingDiverged(divergence.message())
    return DIVERGED_EXIT_CODE


def configure_logging(rank: int, verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )
    mask_logged_secrets()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.engine.worker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging(int(os.environ.get("RANK", "0")))
    try:
        # The launcher passes no user info on the command line; the environment's goes to MLflow's variables.
        args.mlflow_tracking_uri = mlflow_credentials_apart(os.environ, args.mlflow_tracking_uri)
        config = config_from_args(args, os.environ, Path.cwd())
        launch_id = os.environ.get(LAUNCH_ID_VARIABLE) or uuid.uuid4().hex[:12]
        return run_worker(config, launch_id, os.environ, watch_parent=True)
    except RetrainError as error:
        return leave_failed(str(error), error.exit_code, os.environ)
    except Exception as error:  # a crash: its traceback goes into the report, its one line to the user
        rank = os.environ.get("RANK", "0")
        log.debug("rank %s failed", rank, exc_info=True)
        first = next(iter(str(error).strip().splitlines()), "")
        reason = f"training failed on rank {rank}: {type(error).__name__}" + (f": {first}" if first else "")
        return leave_failed(reason, CRASHED_EXIT_CODE, os.environ, traceback.format_exc())


def leave_failed(reason: str, code: int, environ: Mapping[str, str], callstack: str = "") -> int:
    """Report why this worker stops to whoever started torchrun (failure_report.py), and say it in one line
    unless a `retrain train` launcher above torchrun will (it prints the first failed worker's, once)."""
    reason, callstack = mask_secrets(reason), mask_secrets(callstack)  # both are written to files and logs
    report_to_launcher(environ, reason, code, callstack)
    if LAUNCH_ID_VARIABLE not in environ:
        print(f"retrain: error: {reason}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
