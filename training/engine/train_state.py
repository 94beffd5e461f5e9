"""The trainable objects, and the state a checkpoint captures and a resume restores.

The model comes from the task (`Task.build_model(info)`), built right after seeding torch's generator, so
every rank and every attempt starts from the same weights; the optimizer and its schedule are the task's or
the default (training/engine/optimization.py). A checkpoint holds the model, optimizer and LR scheduler
states, the gradient scaler's (`--precision 16-mixed`), the step, the data cursor (epoch and position), the
RNG scheme (counter-based, so derivable from seed, step and rank), the config, the data version, the
attempt history, the MLflow run id, and validation's state with the best validated weights
(training/engine/validation.py). Everything per-rank is derivable.

In the single-file layout rank 0 writes it all: DDP ranks hold identical model and optimizer states. In the
sharded layout (every rank writes, training/checkpoint/sharded.py) the model and optimizer states are
`torch.distributed.checkpoint`'s state dicts (keyed by parameter name, DTensor shards under FSDP), so that
they reshard onto another world size; the best weights are rank 0's full copy; and the rest, small, rides
as one serialised value (`run`), read back with the weights-only unpickler.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.optim.lr_scheduler import LRScheduler

from core.errors import CheckpointError, InputError
from training.checkpoint.checkpointer import Checkpointer, LoadedCheckpoint
from training.checkpoint.records import CheckpointRecord
from training.engine.config import TrainConfig
from training.engine.early_stopping import ValidationState
from training.engine.optimization import Optimization, build_optimization
from training.engine.precision import Precision, require_applicable, require_supported
from training.engine.sampling import DataCursor
from training.engine.strategy import Strategy
from training.tasks.base import Task, built_model

log = logging.getLogger(__name__)

RNG_SCHEME = "counter:sha256(seed,step,rank)"
BEST = "best"  # the sharded layout's entry for the best validated weights


@dataclass
class TrainingObjects:
    model: nn.Module
    optimization: Optimization
    precision: Precision

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.optimization.optimizer

    @property
    def scheduler(self) -> LRScheduler | None:
        return self.optimization.scheduler


@dataclass
class RunState:
    """Progress that survives restarts."""

    step: int = 0
    cursor: DataCursor = field(default_factory=DataCursor)
    elapsed_seconds: float = 0.0
    attempts: list[dict[str, Any]] = field(default_factory=list)
    mlflow_run_id: str | None = None
    # Validation while training (training/engine/validation.py): its decisions so far, and on rank 0 the
    # best validated weights (CPU tensors, replaced whole, never changed in place).
    validation: ValidationState = field(default_factory=ValidationState)
    best_weights: dict[str, torch.Tensor] | None = None

    @property
    def attempt(self) -> int:
        """The current attempt's number, which its checkpoints are named with (0 before the first)."""
        return self.attempts[-1]["attempt"] if self.attempts else 0

    @property
    def evictions_survived(self) -> int:
        return sum(1 for entry in self.attempts if entry["ended"] in ("preempted", "interrupted"))

    @property
    def resumes(self) -> int:
        return sum(1 for entry in self.attempts if entry["resumed_from"] is not None)

    def begin_attempt(
        self, launch_id: str, world_size: int, resumed_from: str | None, first_free: int = 1
    ) -> None:
        """`first_free`: the lowest attempt number no checkpoint in the store is named with. Numbers may skip
        one whose checkpoints are all unreadable (so never resumed), as its names are still taken."""
        self.attempts.append(
            {
                "attempt": max(self.attempt + 1, first_free),
                "launch_id": launch_id,
                "world_size": world_size,
                "started_at_step": self.step,
                "resumed_from": resumed_from,
                "ended": None,
                "ended_at_step": None,
            }
        )

    def end_attempt(self, how: str) -> None:
        self.attempts[-1].update(ended=how, ended_at_step=self.step)


def build_training_objects(
    config: TrainConfig,
    task: Task,
    info: Mapping[str, Any],
    total_steps: int,
    device: torch.device,
    strategy: Strategy | None = None,
) -> TrainingObjects:
    """The model (sharded first if `strategy` shards: None is a replica), its optimizer and precision."""
    require_supported(config.precision, device)  # refused before anything is built
    precision = Precision(config.precision, device)
    torch.manual_seed(config.seed)  # identical initial weights on every rank and every attempt
    model = built_model(task, info)
    if not any(parameter.requires_grad for parameter in model.parameters()):
        raise InputError(f"--task {config.task!r}: build_model returned a model with no trainable parameters")
    require_applicable(config.precision, model)  # before the first step, and before anything is recorded
    model.to(device)  # before the optimizer is built over its parameters
    if strategy is not None:
        strategy.shard(model, task)  # FSDP replaces the parameters with shards: before the optimizer too
    return TrainingObjects(model, build_optimization(task, model, config, total_steps), precision)


def checkpoint_state(
    objects: TrainingObjects, run: RunState, config: TrainConfig, data_version: str, sharded: bool = False
) -> dict:
    if sharded:
        return _sharded_state(objects, run, config, data_version)
    return {
        "model": objects.model.state_dict(),
        "optimizer": objects.optimizer.state_dict(),
        **_progress_state(objects, run, config, data_version),
        # In the checkpoint itself, not a record of its own: eviction of old checkpoints cannot lose it.
        "validation": {**run.validation.to_dict(), "best_weights": run.best_weights},
    }


def _progress_state(objects: TrainingObjects, run: RunState, config: TrainConfig, data_version: str) -> dict:
    """Everything a checkpoint holds besides the model, the optimizer and the best weights."""
    return {
        "scheduler": objects.scheduler.state_dict() if objects.scheduler is not None else None,
        "grad_scaler": objects.precision.state_dict(),
        "progress": {
            "step": run.step,
            "epoch": run.cursor.epoch,
            "position": run.cursor.position,
            "elapsed_seconds": run.elapsed_seconds,
        },
        "rng": {"scheme": RNG_SCHEME, "seed": config.seed},
        "config": config.to_dict(),
        "data_version": data_version,
        "attempts": [dict(entry) for entry in run.attempts],
        "mlflow_run_id": run.mlflow_run_id,
        "validation": run.validation.to_dict(),
    }


def _sharded_state(objects: TrainingObjects, run: RunState, config: TrainConfig, data_version: str) -> dict:
    model_state, optimizer_state = get_state_dict(objects.model, objects.optimizer)  # references, not copies
    buffer = io.BytesIO()
    torch.save(_progress_state(objects, run, config, data_version), buffer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state, "run": buffer.getvalue()}
    if run.best_weights is not None:  # rank 0's alone: it writes them
        state[BEST] = run.best_weights
    return state


def check_agrees(record: CheckpointRecord, state: Mapping[str, Any]) -> None:
    """Refuse (`CheckpointError`) a checkpoint whose state stands elsewhere than its record says: which
    checkpoint is the newest, and whether it may resume under this run's options, are decided by records,
    and training then continues from the state (a record of step 66 over a shard of step 60's would resume
    step 60's progress with weights of both)."""
    progress = state.get("progress")
    attempts = state.get("attempts")
    if not isinstance(progress, Mapping) or not isinstance(attempts, list):
        raise CheckpointError(f"checkpoint {record.name}: its state holds no progress; expected a training's")
    found: dict[str, Any] = {
        "step": progress.get("step"),
        "epoch": progress.get("epoch"),
        "position": progress.get("position"),
        "data_version": state.get("data_version"),
    }
    if attempts and isinstance(attempts[-1], Mapping):  # the attempt that saved it
        found["attempt"] = attempts[-1].get("attempt")
    disagreeing = [
        f"{key} {value!r} (its record: {getattr(record, key)!r})"
        for key, value in found.items()
        if value != getattr(record, key)
    ]
    if disagreeing:
        raise CheckpointError(
            f"checkpoint {record.name} holds a state that disagrees with its record: "
            f"{', '.join(disagreeing)}; not resumed from"
        )


def restore(objects: TrainingObjects, loaded: LoadedCheckpoint, data_version: str) -> RunState:
    state = loaded.state
    check_agrees(loaded.record, state)  # before anything is restored
    objects.model.load_state_dict(state["model"])
    objects.optimizer.load_state_dict(state["optimizer"])
    run = _restore_progress(objects, state, loaded.record, data_version)
    validation = state.get("validation")  # absent from checkpoints made before validation existed
    if validation is not None:
        run.best_weights = validation.get("best_weights")
    return run


def restore_sharded(
    objects: TrainingObjects,
    checkpointer: Checkpointer,
    record: CheckpointRecord,
    data_version: str,
    is_primary: bool,
) -> RunState:
    """Every rank together: load sharded checkpoint `record` into the objects, resharded onto this world.
    A checkpoint that fails (a corrupt shard on any rank) raises `CheckpointError` on every rank."""
    metadata = checkpointer.sharded_metadata(record)
    model_state, optimizer_state = get_state_dict(objects.model, objects.optimizer)
    target: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state, "run": b""}
    if is_primary and metadata.holds(BEST + "."):
        # Whole tensors of the model's whole shapes (a DTensor's shape is the global one), on the CPU.
        tensors = cast(dict[str, torch.Tensor], model_state)
        target[BEST] = {name: torch.empty(value.shape, dtype=value.dtype) for name, value in tensors.items()}
    checkpointer.load_shards(record, metadata, target)
    try:
        state = torch.load(io.BytesIO(target["run"]), map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(f"checkpoint {record.name}: its run state cannot be read: {error}") from error
    check_agrees(record, state)  # every rank read the same run state: all refuse it, or none does
    set_state_dict(
        objects.model,
        objects.optimizer,
        model_state_dict=target["model"],
        optim_state_dict=target["optimizer"],
    )
    run = _restore_progress(objects, state, record, data_version)
    run.best_weights = target.get(BEST)
    return run


def _restore_progress(
    objects: TrainingObjects, state: Mapping[str, Any], record: CheckpointRecord, data_version: str
) -> RunState:
    if objects.scheduler is not None:
        objects.scheduler.load_state_dict(state["scheduler"])
    objects.precision.load_state_dict(state.get("grad_scaler"))  # absent in checkpoints older than it
    progress = state["progress"]
    cursor = DataCursor(epoch=progress["epoch"], position=progress["position"])
    if state["data_version"] != data_version:
        log.warning(
            "continuing checkpoint %s (data %s) on data %s: epoch %d restarts at its first sample",
            record.name,
            state["data_version"],
            data_version,
            cursor.epoch,
        )
        cursor = DataCursor(epoch=cursor.epoch, position=0)
    run = RunState(
        step=progress["step"],
        cursor=cursor,
        elapsed_seconds=progress["elapsed_seconds"],
        attempts=[dict(entry) for entry in state["attempts"]],
        mlflow_run_id=state["mlflow_run_id"],
    )
    validation = state.get("validation")  # absent from checkpoints made before validation existed
    if validation is not None:
        run.validation = ValidationState.from_dict(validation)
    if run.attempts and run.attempts[-1]["ended"] is None:
        # The attempt that wrote this checkpoint never said goodbye: killed (SIGKILL, node loss) or crashed.
        run.attempts[-1]["ended"] = "interrupted"
    return run
