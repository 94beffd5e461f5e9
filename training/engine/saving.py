"""Rank 0's checkpoints during training: the room check before the first step, saving, and reporting how
each save went. Storage faults are reported, never silent, and never cost the finished model.

What a user sees:

- **Before the first step** the checkpoint location is refused in one line, exit 2 and nothing trained, if a
  test object cannot be written, synced and deleted there (a read-only folder or mount, missing rights), or
  if it lacks free space for the checkpoints the run keeps (training/checkpoint/room.py). The size of a
  checkpoint is the newest one's when resuming, else estimated from the model and its optimizer
  (`estimate_checkpoint_bytes`). With `--nproc` above 1 the launcher checks before torchrun starts, so the
  refusal is one line without torchrun's report; rank 0 checks again, on the storage it will write.
- **A save that fails** is reported once, in one warning line with the operating system's reason:
  `checkpoint at step 40 was not saved: no space left on device on /mnt/ckpt; training goes on and tries
  again at the next interval`. Its partial files are removed. `metadata.json` counts the failed saves
  (`checkpoints.failed`, `checkpoints.failed_since_last_saved`, `checkpoints.last_failure`), and so does the
  MLflow metric `checkpoint_failures`.
- **A finished training** always writes model.pt and metadata.json to `--out` and exits 0. If its last
  save(s) failed, a warning line and `metadata.json`'s `warnings` say so: the model is complete, but a run
  resumed from the checkpoint location would start from the newest durable checkpoint, not from it.
- **An eviction whose save fails** still exits with the preempted code (75), with a warning that the restart
  resumes from an earlier checkpoint (or from the start).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from core.errors import CheckpointError
from training.checkpoint.checkpointer import Checkpointer, CheckpointMeta, LoadedCheckpoint, SaveResult
from training.checkpoint.lease import check_lease
from training.checkpoint.records import REASON_FINAL, REASON_INTERVAL, REASON_PREEMPTED
from training.checkpoint.room import check_room
from training.checkpoint.stores import newest_record, open_checkpoint_store
from training.engine.checkpoint_interval import IntervalCalibration, IntervalChoice
from training.engine.config import TrainConfig
from training.engine.train_state import checkpoint_state
from training.tasks.base import TaskContractError, built_model

if TYPE_CHECKING:
    from training.engine.distributed import DistContext
    from training.engine.tracking import Tracker
    from training.engine.train_state import RunState, TrainingObjects
    from training.tasks.base import Task, TaskData

log = logging.getLogger(__name__)

# Optimizer state tensors kept per trainable parameter, each the parameter's size: Adam and AdamW keep two
# moments (their `step` is a scalar, within the overhead below). The engine builds AdamW; an optimizer not
# listed is assumed to keep two, erring on the side of room.
STATE_TENSORS_PER_PARAMETER = {"Adam": 2, "AdamW": 2, "SGD": 1, "RMSprop": 1, "Adagrad": 1}
# What a checkpoint holds besides tensor bytes: per tensor a zip entry (headers, 64-byte alignment) and its
# pickled reference; once, the scheduler, progress, config and attempt history. The small tabular model's
# checkpoint (18 tensors) carries about 9 KB of it, so these err well on the side of room.
PER_TENSOR_OVERHEAD_BYTES = 1024
FIXED_OVERHEAD_BYTES = 64 * 1024

ESTIMATE_BASIS = "estimated from the model and its optimizer"


def estimate_checkpoint_bytes(model: nn.Module, optimizer: str = "AdamW") -> int:
    """The size of a checkpoint of `model` trained with `optimizer` (a class name), before one exists.

    Parameters and buffers once, plus the optimizer's state tensors for every trainable parameter, plus
    overhead. Works on a model built on the meta device, which holds no memory.
    """
    states = STATE_TENSORS_PER_PARAMETER.get(optimizer, 2)
    parameters = list(model.parameters())
    buffers = list(model.buffers())
    trainable = [parameter for parameter in parameters if parameter.requires_grad]
    tensor_bytes = sum(tensor.numel() * tensor.element_size() for tensor in [*parameters, *buffers])
    state_bytes = states * sum(parameter.numel() * parameter.element_size() for parameter in trainable)
    tensors = len(parameters) + len(buffers) + states * len(trainable)
    return tensor_bytes + state_bytes + tensors * PER_TENSOR_OVERHEAD_BYTES + FIXED_OVERHEAD_BYTES


def _model_for_estimate(task: Task, info: Mapping[str, Any]) -> nn.Module:
    # On the meta device a model has shapes and dtypes but no memory and no initialisation to compute, so the
    # launcher stays small beside the workers it starts. A model that cannot be built there is built for real.
    try:
        with torch.device("meta"):
            return built_model(task, info)
    except TaskContractError:
        raise
    except Exception:
        return built_model(task, info)


def refuse_unfit_checkpoint_location(config: TrainConfig, environ: Mapping[str, str], task: Task) -> None:
    """The launcher's room check (`--nproc` > 1), before torchrun starts: one line instead of a refusal in
    every worker and torchrun's report of it. Resuming, the newest record gives the size; on a fresh start
    the launcher reads the data's `info` and builds the model on the meta device for the estimate."""
    store = open_checkpoint_store(config.checkpoints, environ)
    record = newest_record(store)
    if record is not None:
        check_room(store, record.size, f"the size of {record.name}", config.keep_checkpoints)
        return
    model = _model_for_estimate(task, task.load(config.data).info)
    check_room(store, estimate_checkpoint_bytes(model), ESTIMATE_BASIS, config.keep_checkpoints)


class CheckpointSaving:
    """The trainer's checkpoint side (a mixin of `training.engine.trainer.Trainer`, whose state it uses)."""

    config: TrainConfig
    context: DistContext
    data: TaskData
    checkpointer: Checkpointer
    tracker: Tracker
    launch_id: str
    _run: RunState
    _objects: TrainingObjects
    _calibration: IntervalCalibration | None
    _clock: Callable[[], float]
    _elapsed_before: float
    _attempt_started: float
    _last_save: float
    _emit: Callable[..., None]  # the trainer's progress events

    _total_steps: int

    # -- when -----------------------------------------------------------------------------------------

    def _interval_checkpoint_due(self) -> bool:
        if not self.context.is_primary or self._run.step >= self._total_steps:
            return False
        every_steps = self.config.checkpoint_every_steps
        by_steps = every_steps is not None and self._run.step % every_steps == 0
        return by_steps or self._save_due_by_time()

    def _save_due_by_time(self) -> bool:
        every_seconds = self.config.checkpoint_every_seconds
        if self._calibration is not None:
            if self._calibration.wants_save():
                return True
            every_seconds = self._calibration.interval_seconds  # None while a measuring save is in flight
        return every_seconds is not None and self._clock() - self._last_save >= every_seconds

    # -- before the first step ------------------------------------------------------------------------

    def _room_refusal(self, newest: LoadedCheckpoint | None) -> str | None:
        """Rank 0: None if the checkpoint location can take this run's checkpoints, else the refusal."""
        try:
            self.checkpointer.discard_uncommitted()  # a crashed save's data: its space counts as free
            if newest is not None:
                size, basis = newest.record.size, f"the size of {newest.record.name}"
            else:
                optimizer = type(self._objects.optimizer).__name__
                size, basis = estimate_checkpoint_bytes(self._objects.model, optimizer), ESTIMATE_BASIS
            check_room(self.checkpointer.store, size, basis, self.checkpointer.keep_last)
        except CheckpointError as error:
            return str(error)
        return None

    # -- saving ---------------------------------------------------------------------------------------

    def _save(self, reason: str) -> SaveResult | None:
        """Begin a save; returns (and reports) the previous save's result."""
        check_lease(self.checkpointer.store)  # an attempt that lost its lease stops: another may write here
        run = self._run
        run.elapsed_seconds = self._elapsed_before + self._clock() - self._attempt_started
        self._last_save = self._clock()
        meta = CheckpointMeta(
            step=run.step,
            epoch=run.cursor.epoch,
            position=run.cursor.position,
            reason=reason,
            attempt=run.attempt,
            launch_id=self.launch_id,
            world_size=self.context.world_size,
            data_version=self.data.data_version,
            trajectory=self.config.trajectory(),
        )
        state = checkpoint_state(self._objects, run, self.config, self.data.data_version)
        previous = self.checkpointer.save(state, meta)
        self._report_durable(previous)
        if self._calibration is not None and reason == REASON_INTERVAL:
            self._calibration.save_started()
        return previous

    def _save_and_wait(self, reason: str) -> SaveResult | None:
        """Save and wait until it is durable or has failed; either way it is reported, never raised."""
        self._save(reason)
        result = self.checkpointer.wait_until_durable(raise_on_failure=False)
        self._report_durable(result)
        return result

    # -- reporting ------------------------------------------------------------------------------------

    def _report_durable(self, result: SaveResult | None) -> None:
        """Every save's result passes here exactly once."""
        if result is None:
            return
        if result.record is not None:
            self._report_checkpoint(result)
        else:
            self._report_failed_save(result)
        if self._calibration is not None and result.reason == REASON_INTERVAL:
            choice = self._calibration.observe(result.blocked_seconds, result.write_seconds)
            if choice is not None:
                self._report_interval(choice)

    def _report_checkpoint(self, result: SaveResult) -> None:
        assert result.record is not None
        blocked_ms = result.blocked_seconds * 1000
        self._emit(
            "checkpoint",
            name=result.record.name,
            step=result.step,
            reason=result.reason,
            bytes=result.record.size,
            blocked_ms=blocked_ms,
            write_seconds=result.write_seconds,
        )
        self.tracker.log_metrics(
            {
                "checkpoint_blocked_ms": blocked_ms,
                "checkpoint_write_seconds": result.write_seconds or 0.0,
                "checkpoint_megabytes": result.record.size / 1e6,
            },
            step=result.step,
        )

    def _report_failed_save(self, result: SaveResult) -> None:
        consequence = {
            REASON_INTERVAL: "training goes on and tries again at the next interval",
            REASON_FINAL: f"the model is still written to {self.config.out}",
            REASON_PREEMPTED: f"a restart resumes {self._restart_point()}",
        }.get(result.reason, "training goes on")
        log.warning(
            "%s at step %d was not saved: %s; %s",
            "checkpoint" if result.reason == REASON_INTERVAL else f"the {result.reason} checkpoint",
            result.step,
            result.failure,
            consequence,
        )
        self.tracker.log_metrics({"checkpoint_failures": float(self.checkpointer.stats.failed)}, result.step)

    def _report_interval(self, choice: IntervalChoice) -> None:
        self._run.attempts[-1]["checkpoint_interval"] = choice.fields()
        self._emit("checkpoint_interval", step=self._run.step, **choice.fields())
        self.tracker.log_metrics(choice.metrics(), step=self._run.step)

    def _restart_point(self) -> str:
        """Where a restart from the checkpoint location would begin, as far as this process knows."""
        durable = self.checkpointer.stats.last_saved or self._run.attempts[-1]["resumed_from"]
        return f"from checkpoint {durable}" if durable else "from the start"

    def _checkpoint_warnings(self) -> list[str]:
        """What metadata.json's `warnings` carries, each also logged: here, that the newest saves failed."""
        stats = self.checkpointer.stats
        if not stats.failed_since_last_saved:
            return []
        location = self.checkpointer.store.location
        return [
            f"the last {stats.failed_since_last_saved} checkpoint save(s) failed ({stats.last_failure}); the "
            f"model in {self.config.out} is complete, but a run resumed from {location} starts "
            f"{self._restart_point()}"
        ]

    def _leave_preempted_saving(self) -> dict[str, Any]:
        """Rank 0's save on eviction; the fields the `preempted` event adds about it."""
        result = self._save_and_wait(REASON_PREEMPTED)
        saved = result is not None and result.record is not None
        return {"saved": saved} if saved else {"saved": False, "resumes": self._restart_point()}
