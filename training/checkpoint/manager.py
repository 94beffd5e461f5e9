"""The trainer's checkpoints: which one to resume, when to save, the saving, and how each save went.

The trainer holds one `CheckpointManager`, built with everything it needs, and asks it at each point of an
attempt: `resume()` before the first step, `interval_save_due()` after each step, `save()` when one is due,
`poll()` for a background save that has finished, `save_on_eviction()` and `save_final()` at the end. In the
single-file layout only rank 0 saves; in the sharded layout every rank saves its shard at the same steps
(`every_rank_saves`), and a save due by time is rank 0's vote, carried to every rank by the step exchange
(`time_vote`). Every rank resumes from the checkpoint rank 0 picks. Storage faults are reported, never
silent, and never cost the finished model.

What a user sees:

- **Before the first step** the checkpoint location is refused in one line, exit 2 and nothing trained, if a
  test object cannot be written, synced and deleted there (a read-only folder or mount, missing rights), or
  if it lacks free space for the checkpoints the run keeps (training/checkpoint/free_space.py). The size of a
  checkpoint is the newest one's when resuming, else estimated from the model and its optimizer
  (training/checkpoint/estimate.py). With `--nproc` above 1 the launcher checks before torchrun starts, so
  the refusal is one line without torchrun's report; rank 0 checks again, on the storage it will write.
- **When to save**: every `--checkpoint-every-steps` steps, and every `--checkpoint-every-seconds`, or with
  `auto` at the interval chosen from what this attempt's first saves cost (training/checkpoint/interval.py);
  at once on eviction; and at the end.
- **A snapshot whose weights are not finite** is never saved: each save checks the weights of its staged copy
  in the background, off the training thread, before a commit record is written (in the sharded layout each
  rank what it writes, and one rank's refusal refuses the save on all). It is reported as one warning line,
  `step 20 is not checkpointed: the weights it left are not finite`, and is not counted as a failed save;
  the newest checkpoint stays the last good one, and the divergence stop follows from the step's loss.
- **A save that fails** is reported once, in one warning line with the operating system's reason:
  `checkpoint at step 40 was not saved: no space left on device on /mnt/ckpt; training goes on and tries
  again at the next interval`. Its partial files are removed. `metadata.json` counts the failed saves
  (`checkpoints.failed`, `checkpoints.failed_since_last_saved`, `checkpoints.last_failure`) and lists each
  save that did not happen (`checkpoints.not_saved`), and so does the MLflow metric `checkpoint_failures`;
  the run's summary names their steps (the `done` line, the MLflow tag `retrain.checkpoints_not_saved`).
- **A finished training** always writes model.pt and metadata.json to `--out` and exits 0. If its last
  save(s) failed, a warning line and `metadata.json`'s `warnings` say so: the model is complete, but a run
  resumed from the checkpoint location would start from the newest durable checkpoint, not from it. If
  earlier saves failed, whose later ones are durable, a warning says that too.
- **A checkpoint that fails to load at a resume** (damaged, incomplete, or holding a state other than its
  record's) is skipped for the one before, and never counted among the kept ones: the pruning after the
  next durable save removes it, with a warning, so the valid one before it is kept.
- **An eviction whose save fails** still exits with the preempted code (75), with a warning that the restart
  resumes from an earlier checkpoint (or from the start).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.distributed.tensor import DTensor

from core.errors import CheckpointError
from core.train_rules import AUTO_INTERVAL
from training.checkpoint.checkpointer import (
    Checkpointer,
    LoadedCheckpoint,
    SaveResult,
    SnapshotCheck,
)
from training.checkpoint.estimate import ESTIMATE_BASIS, estimate_checkpoint_bytes
from training.checkpoint.free_space import check_room
from training.checkpoint.interval import IntervalCalibration, IntervalChoice
from training.checkpoint.lease import check_lease
from training.checkpoint.records import (
    LAYOUT_SHARDED,
    REASON_FINAL,
    REASON_INTERVAL,
    REASON_PREEMPTED,
    CheckpointMeta,
    CheckpointRecord,
)
from training.engine.config import TrainConfig
from training.engine.distributed import DistContext, broadcast_from_primary
from training.engine.resume_policy import check_resumable
from training.engine.strategy import tensors_finite
from training.engine.tracking import Tracker
from training.engine.train_state import (
    RunState,
    TrainingObjects,
    check_agrees,
    checkpoint_state,
    restore,
    restore_sharded,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resumption:
    """Where an attempt starts: the run's progress (fresh, or restored from `loaded`), and the number its
    checkpoints are named with."""

    run: RunState
    loaded: LoadedCheckpoint | None
    attempt_number: int


class CheckpointManager:
    """One attempt's checkpoints, for the trainer that holds it.

    `objects` are what a checkpoint captures and a resume restores; `emit` sends a progress event (the
    trainer's renderer); `clock` times the interval. The run's progress (`RunState`) is the trainer's: it is
    passed to each call, with its elapsed time up to date.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        config: TrainConfig,
        context: DistContext,
        objects: TrainingObjects,
        *,
        data_version: str,
        launch_id: str,
        total_steps: int,
        tracker: Tracker,
        emit: Callable[..., None],
        clock: Callable[[], float],
    ) -> None:
        self.checkpointer = checkpointer
        self._config = config
        self._context = context
        self._objects = objects
        self._data_version = data_version
        self._launch_id = launch_id
        self._total_steps = total_steps
        self._tracker = tracker
        self._emit = emit
        self._clock = clock
        every_seconds = config.checkpoint_every_seconds
        # Only the primary saves, so only it measures; every attempt anew, for its node's storage.
        auto = every_seconds == AUTO_INTERVAL
        self._calibration = IntervalCalibration(config.mtbe_hours) if auto and context.is_primary else None
        self._every_seconds = None if isinstance(every_seconds, str) else every_seconds
        self._last_save = clock()  # restarted by `begin_attempt`, once the checkpoint is loaded
        self.every_rank_saves = checkpointer.shards is not None
        self._vote_cast = False  # rank 0's time vote, cast into a step exchange, not yet saved
        self._finite_weights = finite_weights_check(objects.model)

    # -- before the first step ------------------------------------------------------------------------

    def resume(self) -> Resumption:
        """Rank 0 picks the checkpoints to try, newest first, and the attempt number, and checks that the
        checkpoint location can take the run's checkpoints; every rank uses the same, or refuses the same.

        A single-file checkpoint rank 0 has verified whole. A sharded one every rank loads together, each
        checking the objects it reads; if any fails, every rank goes on to the next. Either is refused if
        its state disagrees with its record (`check_agrees`: its step, epoch, position, attempt, data). A
        sharded load that failed may have filled part of the state, so if none loads the attempt refuses
        to start rather than train from half-restored weights. A checkpoint that failed is never counted
        among the kept ones (`Checkpointer.found_corrupt`)."""
        picked: tuple[list[CheckpointRecord], int, str | None] | None = None
        single: LoadedCheckpoint | None = None
        if self._context.is_primary:
            candidates = self.checkpointer.resume_candidates(check=check_agrees)
            records = [each.record if isinstance(each, LoadedCheckpoint) else each for each in candidates]
            single = next((each for each in candidates if isinstance(each, LoadedCheckpoint)), None)
            refusal = self._room_refusal(records[0] if records else None)
            picked = (records, self.checkpointer.next_attempt(), refusal)
        records, attempt_number, refusal = cast(
            tuple[list[CheckpointRecord], int, str | None], broadcast_from_primary(picked, self._context)
        )
        if refusal is not None:
            raise CheckpointError(refusal)
        failures: list[str] = []
        for record in records:
            check_resumable(record, self._config, self._data_version)
            if record.layout != LAYOUT_SHARDED:
                loaded = single if single is not None else self.checkpointer.load(record.name)
                return Resumption(restore(self._objects, loaded, self._data_version), loaded, attempt_number)
            try:
                run = restore_sharded(
                    self._objects, self.checkpointer, record, self._data_version, self._context.is_primary
                )
            except CheckpointError as error:
                if self._context.is_primary:
                    log.warning(
                        "skipping checkpoint %s in %s: %s",
                        record.name,
                        self.checkpointer.store.location,
                        error,
                    )
                self.checkpointer.found_corrupt(record.name, str(error))
                failures.append(f"{record.name}: {error}")
                continue
            return Resumption(run, LoadedCheckpoint(record, {}), attempt_number)
        if failures:
            raise CheckpointError(
                f"no checkpoint in {self.checkpointer.store.location} could be loaded "
                f"({'; '.join(failures)}); move them away to start this training afresh"
            )
        return Resumption(RunState(), None, attempt_number)

    def _room_refusal(self, newest: CheckpointRecord | None) -> str | None:
        """Rank 0: None if the checkpoint location can take this run's checkpoints, else the refusal."""
        try:
            self.checkpointer.discard_uncommitted()  # a crashed save's data: its space counts as free
            if newest is not None:
                size, basis = newest.size, f"the size of {newest.name}"
            else:
                optimizer = type(self._objects.optimizer).__name__
                best_copy = self._config.validates  # the best validated weights ride along
                size = estimate_checkpoint_bytes(self._objects.model, optimizer, best_copy)
                basis = ESTIMATE_BASIS
            check_room(self.checkpointer.store, size, basis, self.checkpointer.keep_last)
        except CheckpointError as error:
            return str(error)
        return None

    def begin_attempt(self) -> None:
        """The attempt's first step is next: the time interval counts from here."""
        self._last_save = self._clock()

    # -- when -----------------------------------------------------------------------------------------

    def interval_save_due(self, step: int, voted: bool = False) -> bool:
        """Whether this rank should save the step just trained (never the last: the final save takes it).

        Single-file layout: rank 0 alone decides, by steps and by its clock. Sharded layout: every rank
        decides alike, by steps, or because the step exchange just agreed on rank 0's time vote (`voted`)."""
        if step >= self._total_steps or not (self._context.is_primary or self.every_rank_saves):
            return False
        every_steps = self._config.checkpoint_every_steps
        by_steps = every_steps is not None and step % every_steps == 0
        if self.every_rank_saves:
            return by_steps or voted
        return by_steps or self._save_due_by_time()

    def time_vote(self) -> bool:
        """Sharded layout, rank 0: whether to ask every rank, through the next step exchange, for a save due
        by time. Asked once per save: the vote stands until the save it asked for has begun."""
        if not (self.every_rank_saves and self._context.is_primary) or self._vote_cast:
            return False
        self._vote_cast = self._save_due_by_time()
        return self._vote_cast

    def _save_due_by_time(self) -> bool:
        every_seconds = self._every_seconds
        if self._calibration is not None:
            if self._calibration.wants_save():
                return True
            every_seconds = self._calibration.interval_seconds  # None while a measuring save is in flight
        return every_seconds is not None and self._clock() - self._last_save >= every_seconds

    # -- saving ---------------------------------------------------------------------------------------

    def wait_until_staged(self) -> None:
        """Before the optimizer step: a snapshot still copying the previous checkpoint reads the weights the
        optimizer is about to change."""
        self.checkpointer.wait_until_staged()

    def save(self, reason: str, run: RunState) -> SaveResult | None:
        """Begin a save of `run` and the objects; returns (and reports) the previous save's result."""
        if self._context.is_primary:  # rank 0 holds the lease; in the sharded layout the others write too
            check_lease(
                self.checkpointer.store
            )  # an attempt that lost its lease stops: another may write here
        self._last_save = self._clock()
        self._vote_cast = False
        meta = CheckpointMeta(
            step=run.step,
            epoch=run.cursor.epoch,
            position=run.cursor.position,
            reason=reason,
            attempt=run.attempt,
            launch_id=self._launch_id,
            world_size=self._context.world_size,
            data_version=self._data_version,
            trajectory=self._config.trajectory(),
        )
        state = checkpoint_state(self._objects, run, self._config, self._data_version, self.every_rank_saves)
        previous = self.checkpointer.save(state, meta, verify=self._finite_weights)
        self._report_durable(previous, run)
        if self._calibration is not None and reason == REASON_INTERVAL:
            self._calibration.save_started()
        return previous

    def poll(self, run: RunState) -> None:
        """Report the save in flight if it has finished, without waiting."""
        self._report_durable(self.checkpointer.poll(), run)

    def save_final(self, run: RunState) -> None:
        """The end of training: save and wait; a failed save is reported, and the model is written anyway."""
        self._save_and_wait(REASON_FINAL, run)

    def save_on_eviction(self, run: RunState) -> dict[str, Any]:
        """The save on eviction (rank 0's, or every rank's in the sharded layout); the fields the `preempted`
        event adds about it. A failed save still leaves, with a warning."""
        result = self._save_and_wait(REASON_PREEMPTED, run)
        saved = result is not None and result.record is not None
        return {"saved": saved} if saved else {"saved": False, "resumes": self._restart_point(run)}

    def _save_and_wait(self, reason: str, run: RunState) -> SaveResult | None:
        """Save and wait until it is durable or has failed; either way it is reported, never raised."""
        self.save(reason, run)
        result = self.checkpointer.wait_until_durable(raise_on_failure=False)
        self._report_durable(result, run)
        return result

    # -- reporting ------------------------------------------------------------------------------------

    def _report_durable(self, result: SaveResult | None, run: RunState) -> None:
        """Every save's result passes here exactly once (rank 0 reports it; another rank only counts it)."""
        if result is None or not self._context.is_primary:
            return
        if result.record is not None:
            self._report_checkpoint(result)
        elif result.refused:
            log.warning("step %d is not checkpointed: %s", result.step, result.failure)
        else:
            self._report_failed_save(result, run)
        if self._calibration is not None and result.reason == REASON_INTERVAL:
            choice = self._calibration.observe(result.blocked_seconds, result.write_seconds)
            if choice is not None:
                self._report_interval(choice, run)

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
        self._tracker.log_metrics(
            {
                "checkpoint_blocked_ms": blocked_ms,
                "checkpoint_write_seconds": result.write_seconds or 0.0,
                "checkpoint_megabytes": result.record.size / 1e6,
            },
            step=result.step,
        )

    def _report_failed_save(self, result: SaveResult, run: RunState) -> None:
        consequence = {
            REASON_INTERVAL: "training goes on and tries again at the next interval",
            REASON_FINAL: f"the model is still written to {self._config.out}",
            REASON_PREEMPTED: f"a restart resumes {self._restart_point(run)}",
        }.get(result.reason, "training goes on")
        log.warning(
            "%s at step %d was not saved: %s; %s",
            "checkpoint" if result.reason == REASON_INTERVAL else f"the {result.reason} checkpoint",
            result.step,
            result.failure,
            consequence,
        )
        self._tracker.log_metrics({"checkpoint_failures": float(self.checkpointer.stats.failed)}, result.step)

    def _report_interval(self, choice: IntervalChoice, run: RunState) -> None:
        run.attempts[-1]["checkpoint_interval"] = choice.fields()
        self._emit("checkpoint_interval", step=run.step, **choice.fields())
        self._tracker.log_metrics(choice.metrics(), step=run.step)

    def _restart_point(self, run: RunState) -> str:
        """Where a restart from the checkpoint location would begin, as far as this process knows."""
        durable = self.checkpointer.stats.last_saved or run.attempts[-1]["resumed_from"]
        return f"from checkpoint {durable}" if durable else "from the start"

    def warnings(self, run: RunState) -> list[str]:
        """What metadata.json's `warnings` carries, each also logged: that the newest saves failed, and that
        earlier ones did, whose later saves are durable."""
        stats = self.checkpointer.stats
        location = self.checkpointer.store.location
        warnings = []
        if stats.failed_since_last_saved:
            warnings.append(
                f"the last {stats.failed_since_last_saved} checkpoint save(s) failed ({stats.last_failure}); "
                f"the model in {self._config.out} is complete, but a run resumed from {location} starts "
                f"{self._restart_point(run)}"
            )
        earlier = stats.failed - stats.failed_since_last_saved
        if earlier:
            failed = [each for each in stats.not_saved if not each.refused]
            listed = failed[: len(failed) - stats.failed_since_last_saved]
            at = f" at step(s) {', '.join(str(each.step) for each in listed)}" if listed else ""
            why = f" ({listed[-1].failure})" if listed else ""
            warnings.append(
                f"{earlier} earlier checkpoint save(s){at} failed{why}; the saves after them in {location} "
                "are durable"
            )
        return warnings

    def not_saved(self) -> str | None:
        """This attempt's saves that did not happen, for the run's summary (the `done` line, an MLflow
        tag): their steps, the newest ones if there were many; None if every save happened."""
        stats = self.checkpointer.stats
        count = stats.failed + stats.refused
        if not count:
            return None
        steps = ", ".join(str(each.step) for each in stats.not_saved)
        if count > len(stats.not_saved):
            return f"{count} saves, the newest at steps {steps}"
        return f"step {steps}" if count == 1 else f"steps {steps}"

    def summary(self) -> dict[str, Any]:
        """metadata.json's `checkpoints`: where they are, and what saving them cost."""
        return {
            "location": self.checkpointer.store.location,
            "layout": self.checkpointer.layout,
            **self.checkpointer.stats.summary(),
        }


def finite_weights_check(model: torch.nn.Module) -> SnapshotCheck:
    """The check every save runs on its staged snapshot: are the model's parameters finite? The parameters
    this rank staged: a replica's whole weights in the single-file layout, what this rank writes in the
    sharded one (the checkpointer makes one rank's refusal every rank's). Buffers are not checked: a model
    may keep an infinite one on purpose (a causal mask)."""
    names = frozenset(name for name, _ in model.named_parameters())

    def check(staged: Mapping[str, Any]) -> str | None:
        weights = staged["model"]
        local = (value.to_local() if isinstance(value, DTensor) else value for value in weights.values())
        parameters = (tensor for name, tensor in zip(weights, local, strict=True) if name in names)
        return None if tensors_finite(parameters) else "the weights it left are not finite"

    return check
