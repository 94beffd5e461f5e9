"""One training process: what `torchrun -m training.engine.worker` (or Azure ML's launcher) starts per rank.

    torchrun --standalone --nproc_per_node=N -m training.engine.worker --data D --out O --checkpoints C ...

Exit codes: 0 completed, 75 preempted (the eviction notice was honoured and the state saved; start it
again to resume), 2 bad input (a one-line error on stderr; also another attempt holding the checkpoint
location past RETRAIN_LEASE_WAIT_SECONDS, or this attempt losing its lease on it), anything else a crash
(the next start resumes from the last durable checkpoint).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.lease import CheckpointLease, LeasedStore
from training.checkpoint.stores import open_checkpoint_lease, open_checkpoint_store
from training.engine.config import TrainConfig
from training.engine.distributed import init_distributed, shutdown_distributed
from training.engine.preemption import (
    LAUNCH_ID_VARIABLE,
    PREEMPTED_EXIT_CODE,
    PreemptionNotice,
    report_preemption_to_launcher,
)
from training.engine.progress import make_renderer
from training.engine.tracking import make_tracker
from training.engine.train_args import add_train_arguments, config_from_args
from training.engine.trainer import PREEMPTED, Trainer
from training.errors import RetrainError
from training.tasks.base import Task
from training.tasks.loader import load_task

log = logging.getLogger("retrain.worker")

JOB_RUN_ID_VARIABLE = "MLFLOW_RUN_ID"  # set by Azure ML: the job's own MLflow run
BAD_INPUT_EXIT_CODE = 2


def configure_numerics(deterministic: bool) -> None:
    # Subnormal floats (below ~1e-38, which Adam's second moments and decaying updates reach) make CPU
    # arithmetic several times slower; flushing them to zero changes nothing a model can notice.
    torch.set_flush_denormal(True)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def run_worker(
    config: TrainConfig, launch_id: str, environ: Mapping[str, str], task: Task | None = None
) -> int:
    """Train as this process's rank; returns the process exit code. `task`: already loaded (in-process)."""
    notice = PreemptionNotice().install()
    context = init_distributed(config.device, environ)
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
        checkpointer = Checkpointer(store, keep_last=config.keep_checkpoints)
        tracker = make_tracker(
            config.mlflow_tracking_uri,
            config.mlflow_experiment,
            config.mlflow_artifact_location,
            context.is_primary,
            job_run_id=environ.get(JOB_RUN_ID_VARIABLE),
        )
        renderer = make_renderer(config.progress, context.is_primary)
        trainer = Trainer(config, context, task, data, checkpointer, tracker, renderer, launch_id, notice)
        try:
            outcome = trainer.run()
        finally:
            checkpointer.close()
            renderer.close()
        if outcome.status != PREEMPTED:
            return 0
        report_preemption_to_launcher(environ)
        return PREEMPTED_EXIT_CODE
    finally:
        if lease is not None:
            lease.release()
        shutdown_distributed()
        notice.uninstall()


def configure_logging(rank: int, verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )


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
        config = config_from_args(args, os.environ, Path.cwd())
        return run_worker(config, os.environ.get(LAUNCH_ID_VARIABLE) or uuid.uuid4().hex[:12], os.environ)
    except RetrainError as error:
        print(f"retrain: error: {error}", file=sys.stderr)
        return BAD_INPUT_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
