"""The checkpointer: asynchronous, checksummed, never-overwriting saves and a verified resume.

A save is three phases. `save()` plans the snapshot (references only) and returns at once; a background
thread copies the tensors into staging buffers, while another serialises each staged tensor straight into
the store, hashing as it goes, then writes the commit record. Training only has to wait before it next
mutates the state (`wait_until_staged`, called before the optimizer step), and a new save waits for the
previous one to be durable, so at most one save is ever in flight. Once a save is durable and its result
handed over, the writer prunes what is no longer needed: nobody waits for that, and the next save's write
queues behind it, so it still finds the space the pruning frees (`wait_until_idle` waits for it too).

A save may carry a check of the snapshot (`verify`), run in the background on the staged copy: the
trainer's "are the weights finite", which would otherwise stop training for a pass over every weight at
each save. A snapshot the check refuses never gets a commit record (`SaveRefused`). In the single-file
layout nothing of it is written; in the sharded layout the check runs while the shards are written, one
rank's refusal refuses the save on every rank, and what was written is removed.

In the single-file layout rank 0 alone saves, serialising everything into one object. In the sharded layout
(`shards` given: training/checkpoint/sharded.py) every rank has a checkpointer, and they save together: each
stages and writes its own shard in its background thread, `torch.distributed.checkpoint` gathers that every
shard is durable, and only then does the coordinator (rank 0) write the commit record, listing each shard's
size and checksum, and tell the others. The collectives of a save run on a gloo group of their own
(`ShardGroup`), so they never interleave with training's on the default group.

In the sharded layout the copy waits for this rank's write plan: who writes which chunk, agreed in
`torch.distributed.checkpoint`'s round of collectives at every save. The copy then fills only what this
rank writes, in the order it writes it (under DDP, its share of the replica), and the writer follows it
tensor by tensor; the check sees what was copied, and every rank's refusal is every rank's, so together
they check every weight once.

A save that fails (a full disk, a read-only mount, a storage outage) leaves nothing that takes space: the
store removes its partial file, and a data object it published before its commit record failed is deleted,
together with any such leftover of an earlier crash. Its result carries one line saying why, with the
operating system's reason where there is one; the caller reports it and decides what to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, BinaryIO, cast

import torch

from core.errors import CheckpointError
from training.checkpoint.open_store import newest_record
from training.checkpoint.records import (
    DATA_SUFFIX,
    LAYOUT_SHARDED,
    LAYOUT_SINGLE,
    RECORD_SUFFIX,
    CheckpointMeta,
    CheckpointRecord,
    checkpoint_name,
    committed_checkpoints,
    next_attempt,
    objects_to_prune,
    uncommitted_data,
)
from training.checkpoint.sharded import (
    CHECKSUM,
    Commit,
    ShardedMetadata,
    ShardGroup,
    load_shards,
    object_sums,
    save_shards,
)
from training.checkpoint.staging import Snapshot, SnapshotStager, StagingPlan
from training.checkpoint.store_protocol import (
    CheckpointStore,
    ObjectExistsError,
    ObjectNotFoundError,
    storage_failure,
)

log = logging.getLogger(__name__)


class SaveRefused(CheckpointError):
    """The save's own check refused its snapshot (its weights are not finite): nothing of it is written."""


# A check of a staged snapshot: None to write it, or why not, in words that finish "not checkpointed: ...".
SnapshotCheck = Callable[[Mapping[str, Any]], str | None]
# A check of a loaded checkpoint's state against its record, raising `CheckpointError` to refuse it.
StateCheck = Callable[[CheckpointRecord, Mapping[str, Any]], None]


@dataclass(frozen=True)
class LoadedCheckpoint:
    record: CheckpointRecord
    state: dict[str, Any]


@dataclass(frozen=True)
class NotSaved:
    """A save that did not happen: its step, why it was taken, and why it was not written (`refused`: its
    own check refused the snapshot, rather than the storage failing it)."""

    step: int
    reason: str
    failure: str
    refused: bool = False


# How many saves that did not happen a run's summary lists, newest last (the counts cover all of them).
NOT_SAVED_LISTED = 20


@dataclass
class CheckpointStats:
    """What checkpointing cost: time training was blocked, and time and bytes of the writes; and which
    saves did not happen."""

    saved: int = 0
    failed: int = 0
    refused: int = 0  # saves whose snapshot their check refused: not failures of the storage
    failed_since_last_saved: int = 0  # the newest saves that failed, one after another
    last_failure: str | None = None
    blocked_seconds: list[float] = field(default_factory=list)
    write_seconds: list[float] = field(default_factory=list)
    bytes_written: int = 0
    last_saved: str | None = None
    not_saved: deque[NotSaved] = field(default_factory=lambda: deque(maxlen=NOT_SAVED_LISTED))

    def summary(self) -> dict[str, Any]:
        def mean(values: list[float]) -> float | None:
            return sum(values) / len(values) if values else None

        return {
            "saved": self.saved,
            "failed": self.failed,
            "refused": self.refused,
            "failed_since_last_saved": self.failed_since_last_saved,
            "last_failure": self.last_failure,
            "blocked_seconds_mean": mean(self.blocked_seconds),
            "blocked_seconds_max": max(self.blocked_seconds, default=None),
            "write_seconds_mean": mean(self.write_seconds),
            "bytes_per_checkpoint": self.bytes_written // self.saved if self.saved else None,
            "last_saved": self.last_saved,
            "not_saved": [asdict(each) for each in self.not_saved],
        }


class _HashingWriter:
    """A write-only file that hashes and counts what passes through it.

    It keeps the `OSError` its file raised: torch swallows it and reports only `[enforce fail at
    inline_container.cc:...] unexpected pos`, which says nothing of the full disk behind it.
    """

    def __init__(self, target: BinaryIO) -> None:
        self._target = target
        self._hash = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None

    def write(self, data: bytes | memoryview) -> int:
        self._hash.update(data)
        self.size += len(data)
        try:
            return self._target.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self._target.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


@dataclass(frozen=True)
class SaveResult:
    """How one save went: its record (None if it failed), and what it cost; if it failed, why, in one line
    ("no space left on device on /mnt/ckpt")."""

    step: int
    reason: str
    record: CheckpointRecord | None
    blocked_seconds: float
    write_seconds: float | None
    error: BaseException | None
    failure: str | None = None
    refused: bool = False  # the save's check refused the snapshot (`failure` says why); nothing was written


@dataclass
class _InFlight:
    meta: CheckpointMeta
    staged: Future[None]
    future: Future[tuple[CheckpointRecord, float]]
    blocked_seconds: float


def _yield_cpu_to_training() -> None:
    """Lower the calling thread's CPU priority (Linux applies a nice value per thread).

    Serialising, hashing and writing a checkpoint costs CPU time; at the lowest priority it is spent in
    the cycles training leaves idle (waiting on communication, a free core) rather than taken from it.
    When training stops to wait for a save (eviction, the end), the thread has the CPU to itself.
    """
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class Checkpointer:
    def __init__(
        self,
        store: CheckpointStore,
        keep_last: int = 2,
        clock: Callable[[], float] = time.perf_counter,
        shards: ShardGroup | None = None,
    ) -> None:
        if keep_last < 2:
            raise CheckpointError(
                f"keep_last={keep_last}: keep at least 2 checkpoints, so that a corrupt newest one still "
                "leaves one to resume from"
            )
        self.store = store
        self.keep_last = keep_last
        self.shards = shards  # None: the single-file layout, rank 0's alone
        self.layout = LAYOUT_SINGLE if shards is None else LAYOUT_SHARDED
        self.stats = CheckpointStats()
        self._clock = clock
        self._stager = SnapshotStager()
        # Staging runs at normal priority: training waits for it before its next optimizer step.
        self._staging = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-stager")
        self._writing = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="checkpoint-writer", initializer=_yield_cpu_to_training
        )
        self._in_flight: _InFlight | None = None
        # Checkpoints this checkpointer found corrupt (at resume): never counted among the kept ones.
        self._corrupt: dict[str, str] = {}

    # -- saving -------------------------------------------------------------------------------------

    def save(
        self, state: Mapping[str, Any], meta: CheckpointMeta, verify: SnapshotCheck | None = None
    ) -> SaveResult | None:
        """Begin saving `state`, which must not be mutated until `wait_until_staged` returns; `verify`, if
        given, checks the staged copy first (see the module's docstring).

        A save still in flight is waited for first; its result is returned (None if there was none).
        """
        started = self._clock()
        previous = self.wait_until_durable(raise_on_failure=False)
        plan = self._stager.plan(state)
        snapshot: Future[Snapshot] = Future()
        # What the writer will write, once its plan is agreed (or nothing, if it ended before that).
        planned: Future[list[torch.Tensor] | None] = Future()
        if self.shards is None:
            planned.set_result(None)  # nothing to agree: the single file is everything, after the copy
        staged = self._staging.submit(self._stage, plan, snapshot, planned)
        checked = self._staging.submit(self._check, staged, snapshot, verify)  # after the copy, same thread
        future = self._writing.submit(self._write, snapshot, checked, meta, planned)
        if self.shards is None or self.shards.coordinator:
            self._writing.submit(self._prune_after, future)  # after the handover: queued behind the write
        self._in_flight = _InFlight(meta, staged, future, blocked_seconds=self._clock() - started)
        return previous

    def wait_until_staged(self) -> None:
        """Block until the in-flight snapshot no longer reads live state (cheap when already done)."""
        in_flight = self._in_flight
        if in_flight is None or in_flight.staged.done():
            return
        started = self._clock()
        wait([in_flight.staged])
        in_flight.blocked_seconds += self._clock() - started

    def poll(self) -> SaveResult | None:
        """The in-flight save's result if it has finished, without waiting."""
        if self._in_flight is None or not self._in_flight.future.done():
            return None
        return self.wait_until_durable(raise_on_failure=False)

    def wait_until_written(self, timeout: float | None = None) -> bool:
        """Block until the in-flight save has finished (durable or failed), leaving its result to `poll`;
        False if it is still being written after `timeout` seconds."""
        in_flight = self._in_flight
        return in_flight is None or bool(wait([in_flight.future], timeout=timeout).done)

    def wait_until_idle(self) -> None:
        """Block until the writer has nothing left to do: the in-flight save (its result stays for `poll`
        or `wait_until_durable`) and the pruning after it."""
        self._writing.submit(lambda: None).result()

    def wait_until_durable(self, raise_on_failure: bool = True) -> SaveResult | None:
        """Block until the in-flight save is committed (None if nothing was saving)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return None
        error = in_flight.future.exception()
        self.stats.blocked_seconds.append(in_flight.blocked_seconds)
        meta = in_flight.meta
        if error is None:
            record, write_seconds = in_flight.future.result()
            self.stats.failed_since_last_saved = 0
            return SaveResult(meta.step, meta.reason, record, in_flight.blocked_seconds, write_seconds, None)
        failure = storage_failure(error, self.store.location)
        refused = isinstance(error, SaveRefused)
        if refused:
            self.stats.refused += 1
        else:
            self.stats.failed += 1
            self.stats.failed_since_last_saved += 1
            self.stats.last_failure = failure
        self.stats.not_saved.append(NotSaved(meta.step, meta.reason, failure, refused))
        # Not logged here: the caller reports the failure once, in words that say what happens next.
        log.debug("checkpoint at step %d failed", meta.step, exc_info=error)
        if raise_on_failure:
            raise CheckpointError(f"checkpoint at step {meta.step} failed: {failure}") from error
        return SaveResult(
            meta.step, meta.reason, None, in_flight.blocked_seconds, None, error, failure, refused
        )

    def close(self) -> None:
        """Wait for the save in flight (a failure or refusal nobody awaited is logged), then stop the
        threads."""
        result = self.wait_until_durable(raise_on_failure=False)
        # Every rank of a sharded save has the same outcome: the coordinator reports it.
        reports = self.shards is None or self.shards.coordinator
        if reports and result is not None and result.failure is not None:
            if result.refused:
                log.warning("step %d is not checkpointed: %s", result.step, result.failure)
            else:
                log.warning("checkpoint at step %d was not saved: %s", result.step, result.failure)
        self._staging.shutdown(wait=True)
        self._writing.shutdown(wait=True)

    def _stage(
        self, plan: StagingPlan, snapshot: Future[Snapshot], planned: Future[list[torch.Tensor] | None]
    ) -> None:
        """The staging thread: hand the writer the snapshot, then fill what it writes once it has planned."""
        try:
            staged = self._stager.snapshot(plan)
        except BaseException as error:
            snapshot.set_exception(error)
            raise
        snapshot.set_result(staged)
        written = planned.result()  # the writer sets it on every way out, so this never outlives the write
        self._stager.copy(plan, staged, None if written is None else staged.buffers_of(written))

    @staticmethod
    def _check(staged: Future[None], snapshot: Future[Snapshot], verify: SnapshotCheck | None) -> str | None:
        """The staging thread, once the copy is done: why the snapshot must not be saved, or None."""
        staged.result()  # a failed copy fails the save with its own error
        return verify(snapshot.result().filled_state()) if verify is not None else None

    def _write(
        self,
        snapshot: Future[Snapshot],
        checked: Future[str | None],
        meta: CheckpointMeta,
        planned: Future[list[torch.Tensor] | None],
    ) -> tuple[CheckpointRecord, float]:
        started = self._clock()
        name = checkpoint_name(meta.step, meta.attempt)
        if self.shards is not None:
            try:
                record = self._write_shards(snapshot, checked, meta, name, self.shards, planned.set_result)
            finally:
                if not planned.done():  # failed before its plan was agreed: the copy ends with nothing
                    planned.set_result([])
        else:
            refusal = checked.result()  # the copy is done, and checked
            if refusal is not None:
                raise SaveRefused(refusal)
            record = self._write_single(snapshot.result().state, meta, name)
        seconds = self._clock() - started
        self._record_write(record, seconds)
        return record, seconds

    def _prune_after(self, write: Future[tuple[CheckpointRecord, float]]) -> None:
        if write.exception() is None:
            self._prune(write.result()[0].name)

    def _write_single(self, state: dict[str, Any], meta: CheckpointMeta, name: str) -> CheckpointRecord:
        try:
            return self._write_objects(state, meta, name)
        except ObjectExistsError:
            raise  # the name is someone else's: nothing of it is ours to remove
        except BaseException:
            # The store removed the partial file of the object that failed; a data object published before
            # its record failed is removed here, with any like it from an earlier crash, so that a full
            # disk gets its space back and the next save can fit.
            self._discard_uncommitted()
            raise

    def _write_shards(
        self,
        snapshot: Future[Snapshot],
        checked: Future[str | None],
        meta: CheckpointMeta,
        name: str,
        shards: ShardGroup,
        planned: Callable[[list[torch.Tensor]], None],
    ) -> CheckpointRecord:
        """Every rank writes its shard, each tensor as soon as it is staged (`planned(tensors)` starts the
        copy of what it writes once its plan is known); once all are durable the coordinator writes the
        record last, and every rank learns how that went (the record, or the one line of why not). A rank
        whose check refused its snapshot still takes part, so that the refusal reaches every rank as the
        save's failure (`SaveRefused`), and no record is written."""

        def refusal() -> BaseException | None:
            reason = checked.result()  # raises the staging's error, if it failed
            return SaveRefused(reason) if reason is not None else None

        unstaged: BaseException | None = None
        try:
            staged = snapshot.result()
            state, ready = staged.state, staged.wait
        except Exception as error:  # no buffers: take part with nothing, and fail every rank with the error
            state, ready, unstaged = {}, lambda tensor: None, error
        commit = Commit(
            record=lambda objects: self._commit_shards(meta, name, objects), abandon=self._abandon
        )
        record: CheckpointRecord = save_shards(
            self.store, name, state, shards, commit,
            ready=ready, refusal=refusal, planned=planned, unstaged=unstaged,
        )  # fmt: skip
        return record

    def _abandon(self, error: BaseException) -> None:
        if not isinstance(error, ObjectExistsError):  # the name is someone else's: nothing of it is ours
            self._discard_uncommitted()  # every rank's writes have ended

    def _commit_shards(
        self, meta: CheckpointMeta, name: str, objects: dict[str, dict[str, Any]]
    ) -> CheckpointRecord:
        record = CheckpointRecord(
            name=name,
            sha256="",
            size=sum(each["size"] for each in objects.values()),
            created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
            layout=LAYOUT_SHARDED,
            checksum=CHECKSUM,
            objects=objects,
            **asdict(meta),
        )
        with self.store.writer(record.record_object) as target:
            target.write(record.to_bytes())
        return record

    def _write_objects(self, state: dict[str, Any], meta: CheckpointMeta, name: str) -> CheckpointRecord:
        with self.store.writer(name + DATA_SUFFIX) as target:
            writer = _HashingWriter(target)
            try:
                torch.save(state, cast(BinaryIO, writer))  # torch writes and flushes; nothing else
            except Exception:
                if writer.error is not None:
                    raise writer.error from None  # the operating system's reason, not torch's enforce line
                raise
        record = CheckpointRecord(
            name=name,
            sha256=writer.hexdigest(),
            size=writer.size,
            created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
            **asdict(meta),
        )
        with self.store.writer(record.record_object) as target:
            target.write(record.to_bytes())
        return record

    def _record_write(self, record: CheckpointRecord, seconds: float) -> None:
        self.stats.saved += 1
        self.stats.write_seconds.append(seconds)
        self.stats.bytes_written += record.size
        self.stats.last_saved = record.name
        log.debug("checkpoint %s durable: %d bytes in %.3f s", record.name, record.size, seconds)

    def _prune(self, written: str) -> None:
        # The new checkpoint is committed whatever happens here: a failure to remove old ones is only logged
        # (the next save's pruning tries again), never reported as a failed save.
        try:
            names = self.store.names()
            unreadable = self._unreadable_records(names, written)
            junk = unreadable + self._known_corrupt(names, set(unreadable))
            for name in objects_to_prune(names, self.keep_last, junk, written):
                self.store.delete(name)
        except Exception as error:
            log.warning("old checkpoints were not removed: %s", storage_failure(error, self.store.location))

    def found_corrupt(self, name: str, reason: str) -> None:
        """Checkpoint `name` failed to load (`reason`): from the next save on it is not counted among the
        kept checkpoints, and goes with the pruning, so that the valid ones it would have displaced stay."""
        self._corrupt[name] = reason

    def _known_corrupt(self, names: list[str], reported: set[str]) -> list[str]:
        """The committed checkpoints found corrupt, each removed with a warning (once: then it is gone) unless
        `reported` already."""
        present = set(committed_checkpoints(names)) - reported
        corrupt = [name for name in self._corrupt if name in present]
        for name in corrupt:
            log.warning(
                "removing checkpoint %s in %s: it failed to load (%s); not kept as a checkpoint",
                name, self.store.location, self._corrupt[name],
            )  # fmt: skip
        return corrupt

    def _unreadable_records(self, names: list[str], written: str) -> list[str]:
        """The committed checkpoints, newest first until `keep_last` readable ones, whose record does not
        parse (`written`, just written, is readable): each is removed with its data, with a warning. Only
        a parse failure counts; a storage failure reading a record raises, and nothing is removed."""
        unreadable, readable = [], 0
        for name in committed_checkpoints(names):
            if readable == self.keep_last:
                break  # older ones are pruned whatever their records say
            if name == written:
                readable += 1
                continue
            try:
                CheckpointRecord.from_bytes(self.store.read(name + RECORD_SUFFIX), name)
            except ObjectNotFoundError:
                continue  # removed meanwhile
            except CheckpointError as error:
                log.warning(
                    "removing checkpoint %s in %s: its record is unreadable (%s); not kept as a checkpoint",
                    name, self.store.location, error,
                )  # fmt: skip
                unreadable.append(name)
                continue
            readable += 1
        return unreadable

    def discard_uncommitted(self) -> int:
        """Remove data objects whose commit record never came (see `uncommitted_data`); returns how many.

        Call it when no save is in flight in this location: at start-up, or from the writer itself.
        """
        leftovers = uncommitted_data(self.store.names())
        for name in leftovers:
            self.store.delete(name)
        if leftovers:
            log.info("removed %d uncommitted checkpoint object(s) in %s", len(leftovers), self.store.location)
        return len(leftovers)

    def _discard_uncommitted(self) -> None:
        try:
            self.discard_uncommitted()
        except Exception as error:  # the storage may be failing as a whole; the save's failure says so
            log.debug("uncommitted checkpoint objects were not removed: %s", error)

    # -- loading ------------------------------------------------------------------------------------

    def newest_record(self) -> CheckpointRecord | None:
        """The newest readable commit record, without fetching any checkpoint data."""
        return newest_record(self.store)

    def next_attempt(self) -> int:
        """The attempt number no checkpoint in the store uses yet, readable or not (see `next_attempt`)."""
        return next_attempt(self.store.names())

    def newest_valid(self) -> LoadedCheckpoint | None:
        """The newest single-file checkpoint that verifies; corrupt or unreadable ones are skipped with a
        warning."""
        for candidate in self.resume_candidates():
            if isinstance(candidate, LoadedCheckpoint):
                return candidate
        return None

    def resume_candidates(self, check: StateCheck | None = None) -> list[LoadedCheckpoint | CheckpointRecord]:
        """What a resume tries, newest first (rank 0, before the others hear of it): sharded checkpoints whose
        record reads and whose objects are all present, as their records (their checksums are verified
        where each rank reads them), down to the newest single-file checkpoint that verifies, loaded, and
        whose state `check` accepts. Unreadable, incomplete, corrupt or refused checkpoints are skipped with
        a warning, and counted corrupt (`found_corrupt`)."""
        candidates: list[LoadedCheckpoint | CheckpointRecord] = []
        names = self.store.names()
        present = set(names)
        for name in committed_checkpoints(names):
            try:
                record = CheckpointRecord.from_bytes(self.store.read(name + RECORD_SUFFIX), name)
                if record.layout != LAYOUT_SHARDED:
                    loaded = self._load_single(record)
                    if check is not None:
                        check(record, loaded.state)
                    candidates.append(loaded)
                    break
                missing = [key for key in record.data_objects if key not in present]
                if missing:
                    raise CheckpointError(f"checkpoint {name} is incomplete: {', '.join(missing)} missing")
                candidates.append(record)
            except CheckpointError as error:
                log.warning("skipping checkpoint %s in %s: %s", name, self.store.location, error)
                self.found_corrupt(name, str(error))
        return candidates

    def sharded_metadata(self, record: CheckpointRecord) -> ShardedMetadata:
        """The verified layout of a sharded checkpoint: which tensors and values it holds."""
        return ShardedMetadata.read(self.store, record.name, object_sums(record.objects, record.checksum))

    def load_shards(
        self, record: CheckpointRecord, metadata: ShardedMetadata, target: dict[str, Any]
    ) -> None:
        """Every rank together: fill `target` (its tensors in place) from sharded checkpoint `record`, each
        object checked against the record before any of it is used. A failure on any rank raises one
        `CheckpointError` on every rank."""
        objects = object_sums(record.objects, record.checksum)
        load_shards(self.store, record.name, objects, metadata, target, self.shards)

    def load(self, name: str) -> LoadedCheckpoint:
        record = CheckpointRecord.from_bytes(self.store.read(name + RECORD_SUFFIX), name)
        if record.layout == LAYOUT_SHARDED:
            raise CheckpointError(f"checkpoint {name} is sharded: every rank loads it together (load_shards)")
        return self._load_single(record)

    def _load_single(self, record: CheckpointRecord) -> LoadedCheckpoint:
        name = record.name
        data = self.store.read(record.data_object)
        if len(data) != record.size:
            raise CheckpointError(f"checkpoint {name} is truncated: {len(data)} of {record.size} bytes")
        digest = hashlib.sha256(data).hexdigest()
        if digest != record.sha256:
            raise CheckpointError(f"checkpoint {name} fails its checksum: sha256 {digest} != {record.sha256}")
        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as error:  # a checksummed file that torch cannot read is still unusable
            raise CheckpointError(f"checkpoint {name} cannot be deserialised: {error}") from error
        return LoadedCheckpoint(record=record, state=state)
