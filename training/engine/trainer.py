"""The data-parallel training loop that survives eviction.

One loop serves every case (single process, torchrun on CPU with gloo, GPUs with NCCL): each step
trains on its share of a global batch, then the ranks exchange one tiny tensor (the loss for the log, and
a vote on whether anyone received an eviction notice), so that all of them stop at the same step. The ranks
hold the model as the strategy says (training/engine/strategy.py: DDP replicas, or FSDP shards). Rank 0 (or,
in the sharded checkpoint layout, every rank its shard) checkpoints asynchronously at the configured
interval (or, with `--checkpoint-every-seconds auto`, at one chosen from what its first saves cost),
immediately when evicted, and at the end: the trainer's checkpoint manager (training/checkpoint/manager.py)
decides when, and saves. A step whose agreed loss is not finite
stops every rank at that step, with nothing saved after it (training/engine/divergence.py). With validation
on, the validation split is scored at the due steps, the best validated weights are kept, and early stopping
ends every rank at the same step (training/engine/validation.py).

The task (training/tasks/base.py) supplies the data, the model, the loss of a batch and the final scores,
and may supply its optimizer and schedule (training/engine/optimization.py); the loop, DDP, sampling, RNG
and checkpoints are the same for every task. How one step is computed (micro-batches, precision, gradient
clipping) is training/engine/train_step.py's.
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

import training
from core.task_ref import written_options
from training.checkpoint.checkpointer import Checkpointer, LoadedCheckpoint
from training.checkpoint.manager import CheckpointManager
from training.checkpoint.records import REASON_INTERVAL
from training.engine.batch_split import micro_batch_size
from training.engine.batches import BatchSource, on_device
from training.engine.config import TrainConfig
from training.engine.consensus import StepConsensus, StepVerdict
from training.engine.distributed import DistContext, barrier
from training.engine.divergence import DIVERGED_EXIT_CODE, Divergence, is_finite
from training.engine.outputs import scores, weights_sha256, write_metadata, write_model
from training.engine.precision import parameter_dtype
from training.engine.preemption import PREEMPTED_EXIT_CODE, PreemptionNotice
from training.engine.progress import ProgressRenderer
from training.engine.sampling import BatchPlan, epoch_permutation, rank_batch_indices, seed_step
from training.engine.strategy import make_strategy
from training.engine.throughput import ThroughputMeter
from training.engine.tracking import Tracker
from training.engine.train_state import RunState, build_training_objects
from training.engine.train_step import TrainStep
from training.engine.validation import Validator
from training.tasks.base import Task, TaskData, built_model, loss_takes_info

log = logging.getLogger(__name__)

COMPLETED = "completed"
PREEMPTED = "preempted"
DIVERGED = "diverged"


@dataclass(frozen=True)
class TrainOutcome:
    status: str
    step: int
    divergence: Divergence | None = None  # set when `status` is DIVERGED


class Trainer:
    """One attempt of a training: built with its data, model and optimizer, then `run()` once."""

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
        self.tracker = tracker
        self.renderer = renderer
        self.launch_id = launch_id
        self.notice = notice
        self._clock = clock
        # What the loop trains: the data plan, and the model, optimizer and schedule (the same initial
        # weights on every rank; a resume loads its checkpoint into them).
        self._train_batches = BatchSource(data.split("train"), context.device, config.task)
        self._plan = BatchPlan(len(self._train_batches), config.global_batch_size)
        # Refuse a batch the ranks, or each rank's micro-batches, cannot share.
        micro_batch_size(config.global_batch_size, context.world_size, config.accumulate_grad_batches)
        self._total_steps = self._plan.steps_per_epoch * config.epochs
        self._strategy = make_strategy(config.strategy, context)
        self._objects = build_training_objects(
            config, task, data.info, self._total_steps, context.device, self._strategy
        )
        self._step = TrainStep(
            task,
            self._train_batches,
            self._objects.optimization,
            self._objects.precision,
            accumulate_grad_batches=config.accumulate_grad_batches,
            grad_clip_norm=config.grad_clip_norm,
            loss_info=data.info if loss_takes_info(task) else None,
        )
        self._network: nn.Module = self._objects.model  # wrapped for DDP once the checkpoint is loaded
        self._checkpoints = CheckpointManager(
            checkpointer,
            config,
            context,
            self._objects,
            data_version=data.data_version,
            launch_id=launch_id,
            total_steps=self._total_steps,
            tracker=tracker,
            emit=self._emit,
            clock=clock,
        )
        self._validator = Validator(
            config,
            context,
            task,
            data,
            self._objects.model,
            tracker,
            self._emit,
            strategy=self._strategy,
            steps_per_epoch=self._plan.steps_per_epoch,
            total_steps=self._total_steps,
        )
        # The run's progress: fresh here, restored by `run()` when there is a checkpoint to resume.
        self._run = RunState()
        self._elapsed_before = 0.0  # the run's time in earlier attempts
        self._attempt_started = clock()  # restarted when the first step is next
        self._meter = ThroughputMeter(clock=time.perf_counter)
        self._last_loss: float | None = None
        self._divergence: Divergence | None = None
        self._tracking = False  # whether this attempt's tracked run is started, so ours to end
        # The current epoch's sample order, drawn once per epoch.
        self._permutation_epoch, self._permutation = -1, torch.empty(0)

    def run(self) -> TrainOutcome:
        resumption = self._checkpoints.resume()
        resumed, self._run = resumption.loaded, resumption.run
        try:
            return self._run_attempt(resumed, resumption.attempt_number)
        except BaseException:
            # Whatever stops the attempt here (the task's code raising, a store failing, an interrupt) ends
            # its tracked run FAILED: never left RUNNING.
            if self._tracking:
                self.tracker.finish("FAILED")
            raise

    def _run_attempt(self, resumed: LoadedCheckpoint | None, attempt_number: int) -> TrainOutcome:
        self._start_attempt(resumed, attempt_number)
        self._network = self._strategy.wrap(self._objects.model)
        ending = self._train()
        if ending == PREEMPTED:
            return self._leave_preempted()
        if ending == DIVERGED:
            return self._leave_diverged()
        # Re-running a finished training only rewrites its outputs; there is nothing new to checkpoint.
        return self._finish(progressed=resumed is None or self._run.step > resumed.record.step)

    # -- start ----------------------------------------------------------------------------------------

    def _start_attempt(self, resumed: LoadedCheckpoint | None, attempt_number: int) -> None:
        run = self._run
        previous_world = run.attempts[-1]["world_size"] if run.attempts else None
        resumed_from = resumed.record.name if resumed else None
        run.begin_attempt(self.launch_id, self.context.world_size, resumed_from, attempt_number)
        self._attempt_started = self._clock()
        self._elapsed_before = run.elapsed_seconds
        self._checkpoints.begin_attempt()
        if previous_world is not None and previous_world != self.context.world_size:
            log.warning(
                "world size changed from %d to %d: global batch stays %d (per rank %d)",
                previous_world,
                self.context.world_size,
                self.config.global_batch_size,
                self._plan.per_rank_batch_size(self.context.world_size),
            )
        run.mlflow_run_id = self.tracker.start(run.mlflow_run_id, self._tracked_params(), self._tags())
        self._tracking = True
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

    # -- the loop -------------------------------------------------------------------------------------

    def _train(self) -> str:
        consensus = StepConsensus(self.context)
        while self._run.step < self._total_steps and not self._run.validation.stopped:
            local_loss = self._train_step()
            self._meter.update(self.config.global_batch_size)
            self._validator.after_step(self._run)  # before anything may save this step's state
            verdict = consensus.exchange(
                self._run.step,
                local_loss,
                self.notice.received,
                self._step_details(),
                save_vote=self._checkpoints.time_vote(),
            )
            if verdict is not None:  # every rank reads the same verdict here: all stop together, or none
                self._report_step(verdict)
                if not is_finite(verdict.mean_loss):
                    self._divergence = Divergence(verdict.step, verdict.mean_loss)
                    consensus.drain()  # the next step's exchange, started by every rank: leave none behind
                    return DIVERGED
                if verdict.stop_requested:
                    return self._last_step(consensus.drain(), PREEMPTED)
            last = self._run.validation.stopped  # early stopping: the final save takes this step
            voted = verdict is not None and verdict.save_requested
            if (
                not last
                and self._checkpoints.interval_save_due(self._run.step, voted)
                and self._safe_to_save(consensus.settle())
            ):
                self._checkpoints.save(REASON_INTERVAL, self._progress())
            self._checkpoints.poll(self._run)
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
        """Whether rank 0 (every rank, in the sharded layout) may checkpoint the step just trained, whose
        agreed verdict is still in flight.

        The verdict on a step arrives one step late, so an interval save due now would be made before any
        rank knew whether this step's loss was finite, and a poisoned optimizer step would become the
        newest checkpoint. So rank 0 settles this step's exchange first: every rank has started it, so only
        rank 0 waits, and only when a save is due. In the sharded layout every rank settles alike, so all
        save or none does. A step whose loss was not finite is not saved; its verdict stops every rank at
        the end of the next step, so the newest checkpoint stays the last good one.

        The weights are checked too, as they show a non-finite gradient of any rank (DDP averages them) even
        when every loss was finite, but not here: the save checks its staged copy in the background writer
        and refuses to write it (training/checkpoint/manager.py), and the next step's loss, or `_last_step`
        at the end, stops the run.
        """
        if verdict is not None and is_finite(verdict.mean_loss):
            return True
        if self.context.is_primary:
            log.warning("step %d is not checkpointed: its loss is not finite", self._run.step)
        return False

    def _weights_finite(self) -> bool:
        return self._strategy.weights_finite(self._objects.model)

    def _train_step(self) -> float:
        run = self._run
        indices = rank_batch_indices(
            self._epoch_permutation(run.cursor.epoch),
            run.cursor,
            self._plan,
            self.context.rank,
            self.context.world_size,
        )
        # Seeded first: a split that augments as it reads draws from the generator this step reseeds.
        seed_step(self.config.seed, run.step, self.context.rank, self.context.device)
        # Before the update, the previous checkpoint's snapshot may still be reading the weights.
        loss = self._step.run(self._network, indices, before_update=self._checkpoints.wait_until_staged)
        run.step += 1
        run.cursor = run.cursor.advance(self._plan)
        return loss

    def _epoch_permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._permutation_epoch:
            self._permutation = epoch_permutation(self.config.seed, epoch, self._plan.dataset_size)
            self._permutation_epoch = epoch
        return self._permutation

    # -- the end --------------------------------------------------------------------------------------

    def _leave_preempted(self) -> TrainOutcome:
        self._run.end_attempt("preempted")
        saving: dict[str, Any] = {}
        if self.context.is_primary or self._checkpoints.every_rank_saves:
            saving = self._checkpoints.save_on_eviction(self._progress())  # a failed save still leaves
        if self.context.is_primary:
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
        if progressed and (self.context.is_primary or self._checkpoints.every_rank_saves):
            self._checkpoints.save_final(self._progress())  # reported if it fails; the model is written
        final = self._final_model()  # every rank: under FSDP the weights are gathered
        if final is not None:
            self._write_outputs(final)
        barrier(self.context)
        return TrainOutcome(COMPLETED, self._run.step)

    def _final_model(self) -> nn.Module | None:
        """On rank 0, the model with its last weights whole, to choose the candidate from and to write: its
        own replica under DDP; under FSDP a CPU copy the shards are gathered into (every rank calls this)."""
        if not self._strategy.sharded or not self.context.is_distributed:
            return self._objects.model if self.context.is_primary else None
        weights = self._strategy.full_weights(self._objects.model)
        if weights is None:
            return None
        replica = built_model(self.task, self.data.info)
        replica.load_state_dict(weights)
        return replica

    def _write_outputs(self, final: nn.Module) -> None:
        model, outcome = self._validator.candidate(final, self._run)
        device = next(model.parameters()).device  # a gathered FSDP model is scored on the CPU
        metrics = scores(self.task, model, on_device(self.data.split("validation"), device))
        final_metrics: dict[str, float | None] = {
            f"validation_{name}": value for name, value in metrics.items()
        }
        final_metrics["train_loss"] = (
            self._last_loss
        )  # None when nothing was trained (a finished run resumed)
        out: Path = self.config.out
        write_model(out, model, self.config.task, self.config.task_options, self.data.info)
        warnings = self._checkpoints.warnings(self._run)
        for warning in warnings:
            log.warning("%s", warning)
        metadata = {**self._metadata(model, final_metrics), **outcome, "warnings": warnings}
        write_metadata(out, metadata)
        tracked = {name: value for name, value in final_metrics.items() if value is not None}
        if self.config.validates:  # each validation is logged at its step; the candidate's is one of them
            tracked = {name: value for name, value in tracked.items() if not name.startswith("validation_")}
        # The written model's own scores under names of their own: `validation_loss`'s last value is the
        # last validation's, which is not the candidate's when the best step's weights were chosen.
        tracked |= {
            f"candidate_{name}": value
            for name, value in final_metrics.items()
            if name.startswith("validation_") and value is not None
        }
        self.tracker.log_metrics(tracked, step=self._run.step)
        tags = {
            "retrain.stop_reason": outcome["stop_reason"],
            "retrain.candidate_step": str(outcome["candidate_step"]),
        }
        if outcome["validation"] is not None:
            tags["retrain.best_step"] = str(outcome["validation"]["best_step"])
        not_saved = self._checkpoints.not_saved()  # in the run's summary, not only in the log
        if not_saved is not None:
            tags["retrain.checkpoints_not_saved"] = not_saved
        self.tracker.set_tags(tags)
        self.tracker.finish("FINISHED")
        self._emit(
            "done",
            steps=self._run.step,
            validation=metrics,
            out=str(out),
            stop_reason=outcome["stop_reason"],
            candidate=outcome["candidate"],
            candidate_step=outcome["candidate_step"],
            checkpoints_not_saved=not_saved,
        )

    def _metadata(self, model: nn.Module, final_metrics: dict[str, float | None]) -> dict[str, Any]:
        """`model`: the candidate written, whose weights `weights_sha256` fingerprints."""
        run, config = self._run, self.config
        return {
            "format": "retrain-training/1",
            "weights_sha256": weights_sha256(model),
            "data_version": self.data.data_version,
            "steps": run.step,
            "epochs": run.step / self._plan.steps_per_epoch,
            "seed": config.seed,
            "world_size": self.context.world_size,
            "strategy": config.strategy,
            "global_batch_size": config.global_batch_size,
            "optimization": self._optimization_record(),
            "wall_time_seconds": self._elapsed_seconds(),
            "resumes": run.resumes,
            "evictions_survived": run.evictions_survived,
            "attempts": run.attempts,
            "final_metrics": final_metrics,
            "task": {
                "ref": config.task,
                "name": self.task.name,
                "options": written_options(config.task_options),
            },
            "info": dict(self.data.info),
            "throughput": {
                "samples_per_second": self._meter.samples_per_second(),
                "measured_steps": self._meter.measured_steps,
            },
            "checkpoints": self._checkpoints.summary(),
            "parameters": sum(p.numel() for p in self._objects.model.parameters()),
            "mlflow_run_id": run.mlflow_run_id,
            "config": config.to_dict(),
            "code_version": training.__version__,
            "torch_version": torch.__version__,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def _optimization_record(self) -> dict[str, Any]:
        """What trained the weights: the optimizer and schedule (and whose), and how a step was computed."""
        return {
            **self._objects.optimization.describe(),
            "precision": self.config.precision,
            "parameter_dtype": parameter_dtype(self._objects.model),  # what "32" computed in
            "accumulate_grad_batches": self.config.accumulate_grad_batches,
            "grad_clip_norm": self.config.grad_clip_norm,
            "skipped_steps": self._objects.precision.skipped_steps,  # float16 overflows, this attempt
        }

    def _elapsed_seconds(self) -> float:
        """The run's training time: its earlier attempts' and this one's so far."""
        return self._elapsed_before + self._clock() - self._attempt_started

    def _progress(self) -> RunState:
        """The run's progress with its elapsed time brought up to now: what a checkpoint records."""
        self._run.elapsed_seconds = self._elapsed_seconds()
        return self._run

    # -- reporting ------------------------------------------------------------------------------------

    def _step_details(self) -> dict[str, Any]:
        return {
            "epoch": self._run.cursor.epoch,
            "position": self._run.cursor.position,
            "learning_rate": self._objects.optimization.learning_rate(),
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
            **self._objects.optimization.describe(),
            "parameter_dtype": parameter_dtype(self._objects.model),
            "total_steps": self._total_steps,
            "parameters": sum(p.numel() for p in self._objects.model.parameters()),
        }

    def _tags(self) -> dict[str, str]:
        return {
            "retrain.data_version": self.data.data_version,
            "retrain.launch_id": self.launch_id,
            "retrain.world_size": str(self.context.world_size),
        }
