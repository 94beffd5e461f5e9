"""The data-parallel training loop that survives eviction.

One loop serves every case (single process, torchrun on CPU with gloo, GPUs with NCCL): each step
trains on its share of a global batch, then the ranks exchange one tiny tensor (the loss for the log, and
a vote on whether anyone received an eviction notice), so that all of them stop at the same step. Rank 0
checkpoints asynchronously at the configured interval (or, with `--checkpoint-every-seconds auto`, at one
chosen from what its first saves cost: training/engine/checkpoint_interval.py), immediately when evicted,
and at the end. A step whose agreed loss is not finite stops every rank at that step, with nothing saved
after it (training/engine/divergence.py).

The task (training/tasks/base.py) supplies the data, the model, the loss of a batch and the final scores;
the loop, DDP, sampling, RNG and checkpoints here are the same for every task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import training
from core.errors import CheckpointError
from training.checkpoint.checkpointer import Checkpointer, LoadedCheckpoint
from training.checkpoint.records import REASON_FINAL, REASON_INTERVAL
from training.engine.batches import BatchSource, on_device
from training.engine.checkpoint_interval import IntervalCalibration
from training.engine.config import AUTO_INTERVAL, TrainConfig
from training.engine.consensus import StepConsensus, StepVerdict
from training.engine.distributed import DistContext, barrier, broadcast_from_primary
from training.engine.divergence import DIVERGED_EXIT_CODE, Divergence, is_finite
from training.engine.outputs import scores, weights_sha256, write_metadata, write_model
from training.engine.preemption import PREEMPTED_EXIT_CODE, PreemptionNotice
from training.engine.progress import ProgressRenderer
from training.engine.resume_policy import check_resumable
from training.engine.sampling import BatchPlan, epoch_permutation, rank_batch_indices, step_seed
from training.engine.saving import CheckpointSaving
from training.engine.throughput import ThroughputMeter
from training.engine.tracking import Tracker
from training.engine.train_state import RunState, build_training_objects, restore
from training.tasks.base import Task, TaskData, batch_loss

log = logging.getLogger(__name__)

COMPLETED = "completed"
PREEMPTED = "preempted"
DIVERGED = "diverged"


@dataclass(frozen=True)
class TrainOutcome:
    status: str
    step: int
    divergence: Divergence | None = None  # set when `status` is DIVERGED


class Trainer(CheckpointSaving):
    def __init__(
        self,
        config: TrainConfig,
        context: DistContext,
        task: Task,
        data: TaskData,
        checkpointer: Checkpointer,
        tracker: Tracker,
        renderer: ProgressRenderer,
        launch_id: str,
        notice: PreemptionNotice,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.context = context
        self.task = task
        self.data = data
        self.checkpointer = checkpointer
        self.tracker = tracker
        self.renderer = renderer
        self.launch_id = launch_id
        self.notice = notice
        self._clock = clock
        self._calibration: IntervalCalibration | None = None

    def run(self) -> TrainOutcome:
        self._train_batches = BatchSource(self.data.split("train"), self.context.device, self.config.task)
        self._plan = BatchPlan(len(self._train_batches), self.config.global_batch_size)
        self._plan.per_rank_batch_size(self.context.world_size)
        self._total_steps = self._plan.steps_per_epoch * self.config.epochs
        self._objects = build_training_objects(self.config, self.task, self.data.info, self._total_steps)
        self._objects.model.to(self.context.device)
        resumed = self._resume()
        self._start_attempt(resumed)
        self._network = self._wrap(self._objects.model)
        ending = self._train()
        if ending == PREEMPTED:
            return self._leave_preempted()
        if ending == DIVERGED:
            return self._leave_diverged()
        # Re-running a finished training only rewrites its outputs; there is nothing new to checkpoint.
        return self._finish(progressed=resumed is None or self._run.step > resumed.record.step)

    # -- start ----------------------------------------------------------------------------------------

    def _resume(self) -> LoadedCheckpoint | None:
        """Rank 0 picks the newest valid checkpoint and the attempt number, and checks that the checkpoint
        location can take the run's checkpoints; every rank uses the same, or refuses the same."""
        picked: tuple[str | None, int, str | None] | None = None
        if self.context.is_primary:
            newest = self.checkpointer.newest_valid()
            refusal = self._room_refusal(newest)
            picked = (newest.record.name if newest else None, self.checkpointer.next_attempt(), refusal)
        choice, self._attempt_number, refusal = cast(
            tuple[str | None, int, str | None], broadcast_from_primary(picked, self.context)
        )
        if refusal is not None:
            raise CheckpointError(refusal)
        if choice is None:
            self._run = RunState()
            return None
        loaded = self.checkpointer.load(choice)
        check_resumable(loaded.record, self.config, self.data.data_version)
        self._run = restore(self._objects, loaded, self.data.data_version)
        return loaded

    def _start_attempt(self, resumed: LoadedCheckpoint | None) -> None:
        run = self._run
        previous_world = run.attempts[-1]["world_size"] if run.attempts else None
        resumed_from = resumed.record.name if resumed else None
        run.begin_attempt(self.launch_id, self.context.world_size, resumed_from, self._attempt_number)
        self._attempt_started = self._clock()
        self._elapsed_before = run.elapsed_seconds
        self._last_save = self._clock()
        # Only the primary saves, so only it measures; every attempt anew, for its node's storage.
        if self.config.checkpoint_every_seconds == AUTO_INTERVAL and self.context.is_primary:
            self._calibration = IntervalCalibration(self.config.mtbe_hours)
        self._meter = ThroughputMeter(clock=time.perf_counter)
        self._last_loss: float | None = None
        self._permutation_epoch, self._permutation = -1, torch.empty(0)
        if previous_world is not None and previous_world != self.context.world_size:
            log.warning(
                "world size changed from %d to %d: global batch stays %d (per rank %d)",
                previous_world,
                self.context.world_size,
                self.config.global_batch_size,
                self._plan.per_rank_batch_size(self.context.world_size),
            )
        run.mlflow_run_id = self.tracker.start(run.mlflow_run_id, self._tracked_params(), self._tags())
        if resumed is not None:
            self._emit(
                "resumed",
                checkpoint=resumed.record.name,
                step=run.step,
                epoch=run.cursor.epoch,
                position=run.cursor.position,
            )
        self._emit(
            "start",
            step=run.step,
            total_steps=self._total_steps,
            world_size=self.context.world_size,
            data_version=self.data.data_version,
        )

    def _wrap(self, model: nn.Module) -> nn.Module:
        if not self.context.is_distributed:
            return model
        device_ids = [self.context.local_rank] if self.context.device.type == "cuda" else None
        # Buffers are not broadcast every forward: a tabular model's are constants, and only rank 0's model
        # is saved and scored, so other ranks' running statistics never leave them.
        return DistributedDataParallel(model, device_ids=device_ids, forward_sync_buffers=False)

    # -- the loop -------------------------------------------------------------------------------------

    def _train(self) -> str:
        consensus = StepConsensus(self.context)
        self._divergence: Divergence | None = None
        while self._run.step < self._total_steps:
            local_loss = self._train_step()
            self._meter.update(self.config.global_batch_size)
            verdict = consensus.exchange(
                self._run.step, local_loss, self.notice.received, self._step_details()
            )
            if verdict is not None:  # every rank reads the same verdict here: all stop together, or none
                self._report_step(verdict)
                if not is_finite(verdict.mean_loss):
                    self._divergence = Divergence(verdict.step, verdict.mean_loss)
                    consensus.drain()  # the next step's exchange, started by every rank: leave none behind
                    return DIVERGED
                if verdict.stop_requested:
                    return self._last_step(consensus.drain(), PREEMPTED)
            if self._interval_checkpoint_due() and self._safe_to_save(consensus.settle()):
                self._save(REASON_INTERVAL)
            self._report_durable(self.checkpointer.poll())
        return self._last_step(consensus.drain(), COMPLETED)

    def _last_step(self, verdict: StepVerdict | None, ending: str) -> str:
        """`ending`, unless the last step's state must not be saved (as the preemption or final checkpoint
        and the model). Every rank decides alike, from the agreed loss and from its own weights: DDP applies
        the same averaged gradients on every rank, so the weights are the same everywhere."""
        self._report_step(verdict)
        if verdict is None:  # nothing trained in this attempt (it resumed a finished run)
            return ending
        if not is_finite(verdict.mean_loss):
            self._divergence = Divergence(verdict.step, verdict.mean_loss)
        elif not self._weights_finite():
            self._divergence = Divergence(verdict.step, verdict.mean_loss, weights_only=True)
        return ending if self._divergence is None else DIVERGED

    def _safe_to_save(self, verdict: StepVerdict | None) -> bool:
        """Whether rank 0 may checkpoint the step just trained, whose agreed verdict is still in flight.

        The verdict on a step arrives one step late, so an interval save due now would be made before any
        rank knew whether this step's loss was finite, and a poisoned optimizer step would become the
        newest checkpoint. So rank 0 settles this step's exchange first: every rank has started it, so only
        rank 0 waits, and only when a save is due. It also checks its weights, which show a non-finite
        gradient of any rank (DDP averages them) even when every loss was finite. A step failing either is
        not saved; its verdict stops every rank at the end of the next step (or a non-finite weight at the
        end, in `_last_step`), so the newest checkpoint stays the last good one.
        """
        if verdict is not None and is_finite(verdict.mean_loss) and self._weights_finite():
            return True
        log.warning(
            "step %d is not checkpointed: its loss or the weights it left are not finite", self._run.step
        )
        return False

    def _weights_finite(self) -> bool:
        checks = [torch.isfinite(parameter.detach()).all() for parameter in self._objects.model.parameters()]
        return not checks or bool(torch.stack(checks).all())  # one device sync for the whole model

    def _train_step(self) -> float:
        run, objects = self._run, self._objects
        indices = rank_batch_indices(
            self._epoch_permutation(run.cursor.epoch),
            run.cursor,
            self._plan,
            self.context.rank,
            self.context.world_size,
        )
        # Seeded first: a split that augments as it reads draws from the generator this step reseeds.
        torch.manual_seed(step_seed(self.config.seed, run.step, self.context.rank))
        batch = self._train_batches.batch(indices)
        self._network.train()
        loss = batch_loss(self.task, self._network, batch)
        objects.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # A snapshot still copying the previous checkpoint reads the weights the optimizer is about to change.
        self.checkpointer.wait_until_staged()
        objects.optimizer.step()
        objects.scheduler.step()
        run.step += 1
        run.cursor = run.cursor.advance(self._plan)
        return loss.item()

    def _epoch_permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._permutation_epoch:
            self._permutation = epoch_permutation(self.config.seed, epoch, self._plan.dataset_size)
            self._permutation_epoch = epoch
        return self._permutation

    # -- the end --------------------------------------------------------------------------------------

    def _leave_preempted(self) -> TrainOutcome:
        self._run.end_attempt("preempted")
        if self.context.is_primary:
            saving = self._leave_preempted_saving()  # a failed save still leaves, with a warning
            self._emit("preempted", step=self._run.step, exit_code=PREEMPTED_EXIT_CODE, **saving)
            self.tracker.set_tags({"retrain.preempted_at_step": str(self._run.step)})
            self.tracker.finish("KILLED")
        barrier(self.context)  # nobody leaves before the agreed checkpoint is durable
        return TrainOutcome(PREEMPTED, self._run.step)

    def _leave_diverged(self) -> TrainOutcome:
        """Stop without saving anything: the newest checkpoint stays the last good one, and `--out` is not
        written. No barrier here: the worker's, after every rank has reported to its launcher, serves."""
        divergence = cast(Divergence, self._divergence)
        self._run.end_attempt(DIVERGED)
        if self.context.is_primary:
            self._emit(
                "diverged",
                step=divergence.step,
                loss=divergence.loss,
                weights_only=divergence.weights_only,
                exit_code=DIVERGED_EXIT_CODE,
            )
            self.tracker.set_tags({"retrain.diverged_at_step": str(divergence.step)})
            self.tracker.finish("FAILED")
        return TrainOutcome(DIVERGED, divergence.step, divergence)

    def _finish(self, progressed: bool) -> TrainOutcome:
        self._run.end_attempt(COMPLETED)
        if self.context.is_primary:
            if progressed:
                self._save_and_wait(REASON_FINAL)  # a failed save is reported; the model is written anyway
            self._write_outputs()
        barrier(self.context)
        return TrainOutcome(COMPLETED, self._run.step)

    def _write_outputs(self) -> None:
        model = self._objects.model
        metrics = scores(self.task, model, on_device(self.data.split("validation"), self.context.device))
        final_metrics = {f"validation_{name}": value for name, value in metrics.items()}
        final_metrics["train_loss"] = self._last_loss
        out: Path = self.config.out
        write_model(out, model, self.config.task, self.config.task_options, self.data.info)
        warnings = self._checkpoint_warnings()
        for warning in warnings:
            log.warning("%s", warning)
        write_metadata(out, {**self._metadata(final_metrics), "warnings": warnings})
        self.tracker.log_metrics(final_metrics, step=self._run.step)
        self.tracker.finish("FINISHED")
        self._emit("done", steps=self._run.step, validation=metrics, out=str(out))

    def _metadata(self, final_metrics: dict[str, float]) -> dict[str, Any]:
        run, config = self._run, self.config
        return {
            "format": "retrain-training/1",
            "weights_sha256": weights_sha256(self._objects.model),
            "data_version": self.data.data_version,
            "steps": run.step,
            "epochs": run.step / self._plan.steps_per_epoch,
            "seed": config.seed,
            "world_size": self.context.world_size,
            "global_batch_size": config.global_batch_size,
            "wall_time_seconds": self._elapsed_before + self._clock() - self._attempt_started,
            "resumes": run.resumes,
            "evictions_survived": run.evictions_survived,
            "attempts": run.attempts,
            "final_metrics": final_metrics,
            "task": {"ref": config.task, "name": self.task.name, "options": config.task_options},
            "info": dict(self.data.info),
            "throughput": {
                "samples_per_second": self._meter.samples_per_second(),
                "measured_steps": self._meter.measured_steps,
            },
            "checkpoints": {
                "location": self.checkpointer.store.location,
                **self.checkpointer.stats.summary(),
            },
            "parameters": sum(p.numel() for p in self._objects.model.parameters()),
            "mlflow_run_id": run.mlflow_run_id,
            "config": config.to_dict(),
            "code_version": training.__version__,
            "torch_version": torch.__version__,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    # -- reporting ------------------------------------------------------------------------------------

    def _step_details(self) -> dict[str, Any]:
        return {
            "epoch": self._run.cursor.epoch,
            "position": self._run.cursor.position,
            "learning_rate": self._objects.scheduler.get_last_lr()[0],
            "samples_per_second": self._meter.samples_per_second(),
        }

    def _report_step(self, verdict: StepVerdict | None) -> None:
        if verdict is None:  # nothing trained in this attempt (it resumed a finished run)
            return
        self._last_loss = verdict.mean_loss
        details = verdict.details
        self._emit(
            "step", step=verdict.step, total_steps=self._total_steps, loss=verdict.mean_loss, **details
        )
        self.tracker.log_metrics(
            {
                "loss": verdict.mean_loss,
                "learning_rate": details["learning_rate"],
                "samples_per_second": details["samples_per_second"],
            },
            step=verdict.step,
        )

    def _emit(self, kind: str, **fields: Any) -> None:
        self.renderer.emit({"event": kind, **fields})

    def _tracked_params(self) -> dict[str, Any]:
        return {
            **self.config.to_dict(),
            "total_steps": self._total_steps,
            "parameters": sum(p.numel() for p in self._objects.model.parameters()),
        }

    def _tags(self) -> dict[str, str]:
        return {
            "retrain.data_version": self.data.data_version,
            "retrain.launch_id": self.launch_id,
            "retrain.world_size": str(self.context.world_size),
        }
