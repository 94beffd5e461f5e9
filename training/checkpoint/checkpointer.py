"""The checkpointer: asynchronous, checksummed, never-overwriting saves and a verified resume.

A save is three phases. `save()` plans the snapshot (references only) and returns at once; a background
thread copies the tensors into staging buffers, then serialises them straight into the store while
hashing, then writes the commit record and prunes what is no longer needed. Training only has to wait
before it next mutates the state (`wait_until_staged`, called before the optimizer step), and a new save
waits for the previous one to be durable, so at most one save is ever in flight.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, BinaryIO

import torch

from training.checkpoint.records import (
    DATA_SUFFIX,
    RECORD_SUFFIX,
    CheckpointRecord,
    checkpoint_name,
    committed_checkpoints,
    next_attempt,
    objects_to_prune,
)
from training.checkpoint.staging import SnapshotStager
from training.checkpoint.store import CheckpointStore
from training.checkpoint.stores import newest_record
from training.errors import CheckpointError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointMeta:
    """Where training stands at the checkpoint, and why it is taken."""

    step: int
    epoch: int
    position: int
    reason: str
    attempt: int
    launch_id: str
    world_size: int
    data_version: str
    trajectory: dict[str, Any] = field(default_factory=dict)  # the options that decide the run's course


@dataclass(frozen=True)
class LoadedCheckpoint:
    record: CheckpointRecord
    state: dict[str, Any]


@dataclass
class CheckpointStats:
    """What checkpointing cost: time training was blocked, and time and bytes of the writes."""

    saved: int = 0
    failed: int = 0
    blocked_seconds: list[float] = field(default_factory=list)
    write_seconds: list[float] = field(default_factory=list)
    bytes_written: int = 0
    last_saved: str | None = None

    def summary(self) -> dict[str, Any]:
        def mean(values: list[float]) -> float | None:
            return sum(values) / len(values) if values else None

        return {
            "saved": self.saved,
            "failed": self.failed,
            "blocked_seconds_mean": mean(self.blocked_seconds),
            "blocked_seconds_max": max(self.blocked_seconds, default=None),
            "write_seconds_mean": mean(self.write_seconds),
            "bytes_per_checkpoint": self.bytes_written // self.saved if self.saved else None,
            "last_saved": self.last_saved,
        }


class _HashingWriter:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, target: BinaryIO) -> None:
        self._target = target
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | memoryview) -> int:
        self._hash.update(data)
        self.size += len(data)
        return self._target.write(data)

    def flush(self) -> None:
        self._target.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


@dataclass(frozen=True)
class SaveResult:
    """How one save went: its record (None if it failed), and what it cost."""

    step: int
    reason: str
    record: CheckpointRecord | None
    blocked_seconds: float
    write_seconds: float | None
    error: BaseException | None


@dataclass
class _InFlight:
    meta: CheckpointMeta
    staged: Future[dict[str, Any]]
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
        self, store: CheckpointStore, keep_last: int = 2, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if keep_last < 2:
            raise CheckpointError(
                f"keep_last={keep_last}: keep at least 2 checkpoints, so that a corrupt newest one still "
                "leaves one to resume from"
            )
        self.store = store
        self.keep_last = keep_last
        self.stats = CheckpointStats()
        self._clock = clock
        self._stager = SnapshotStager()
        # Staging runs at normal priority: training waits for it before its next optimizer step.
        self._staging = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-stager")
        self._writing = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="checkpoint-writer", initializer=_yield_cpu_to_training
        )
        self._in_flight: _InFlight | None = None

    # -- saving -------------------------------------------------------------------------------------

    def save(self, state: Mapping[str, Any], meta: CheckpointMeta) -> SaveResult | None:
        """Begin saving `state`, which must not be mutated until `wait_until_staged` returns.

        A save still in flight is waited for first; its result is returned (None if there was none).
        """
        started = self._clock()
        previous = self.wait_until_durable(raise_on_failure=False)
        plan = self._stager.plan(state)
        staged = self._staging.submit(self._stager.copy, plan)
        future = self._writing.submit(self._write, staged, meta)
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
            return SaveResult(meta.step, meta.reason, record, in_flight.blocked_seconds, write_seconds, None)
        self.stats.failed += 1
        log.error("checkpoint at step %d failed: %s", meta.step, error)
        if raise_on_failure:
            raise CheckpointError(f"checkpoint at step {meta.step} failed: {error}") from error
        return SaveResult(meta.step, meta.reason, None, in_flight.blocked_seconds, None, error)

    def close(self) -> None:
        self.wait_until_durable(raise_on_failure=False)
        self._staging.shutdown(wait=True)
        self._writing.shutdown(wait=True)

    def _write(self, staged: Future[dict[str, Any]], meta: CheckpointMeta) -> tuple[CheckpointRecord, float]:
        state = staged.result()
        started = self._clock()
        name = checkpoint_name(meta.step, meta.attempt)
        with self.store.writer(name + DATA_SUFFIX) as target:
            writer = _HashingWriter(target)
            torch.save(state, writer)
        record = CheckpointRecord(
            name=name,
            sha256=writer.hexdigest(),
            size=writer.size,
            created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
            **asdict(meta),
        )
        with self.store.writer(record.record_object) as target:
            target.write(record.to_bytes())
        seconds = self._clock() - started
        self._record_write(record, seconds)
        self._prune()
        return record, seconds

    def _record_write(self, record: CheckpointRecord, seconds: float) -> None:
        self.stats.saved += 1
        self.stats.write_seconds.append(seconds)
        self.stats.bytes_written += record.size
        self.stats.last_saved = record.name
        log.debug("checkpoint %s durable: %d bytes in %.3f s", record.name, record.size, seconds)

    def _prune(self) -> None:
        for name in objects_to_prune(self.store.names(), self.keep_last):
            self.store.delete(name)

    # -- loading ------------------------------------------------------------------------------------

    def newest_record(self) -> CheckpointRecord | None:
        """The newest readable commit record, without fetching any checkpoint data."""
        return newest_record(self.store)

    def next_attempt(self) -> int:
        """The attempt number no checkpoint in the store uses yet, readable or not (see `next_attempt`)."""
        return next_attempt(self.store.names())

    def newest_valid(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies; corrupt or unreadable ones are skipped with a warning."""
        for name in committed_checkpoints(self.store.names()):
            try:
                return self.load(name)
            except CheckpointError as error:
                log.warning("skipping checkpoint %s in %s: %s", name, self.store.location, error)
        return None

    def load(self, name: str) -> LoadedCheckpoint:
        record = CheckpointRecord.from_bytes(self.store.read(name + RECORD_SUFFIX), name)
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
