"""One writer per run: a training attempt holds a lease on its checkpoint location while it trains.

Rank 0 takes the lease before it touches the location (before clearing a crashed write's leftovers, which is
safe only when nobody else writes there) and holds it until its checkpointer is closed. A second attempt on
the same location waits for it, up to `RETRAIN_LEASE_WAIT_SECONDS` (default 90 s: longer than a dead
holder's blob lease takes to expire, so a retried Azure ML job takes over from the one that died), and is
then refused in one line naming the holder:

    retrain: error: checkpoint location L is held by another training attempt (host H, pid P, launch I,
    since T) and was not released within 90 s; wait for that attempt to end, or end that process, ...

(exit code 2, nothing written). The twins:
- a local folder: an exclusive `flock` on its hidden `.lease` file, which holds the holder as JSON. The
  kernel releases the lock the moment its process dies, however it dies. A flock is per machine: a folder
  mounted on several nodes needs the Blob location for a lease that holds across nodes.
- Azure Blob Storage (training/checkpoint/blob_lease.py): a blob lease (30 s) on `<prefix>/.lease`, whose
  content is the holder, renewed by a thread every third of its duration (core.locks.LeaseRenewal). A
  holder that dies stops renewing, and its lease expires: the next attempt takes it over.
Object names never start with '.', so `.lease` is never listed, read or pruned as a checkpoint.

A lease that could not be renewed is `lost`: the attempt may no longer write. `LeasedStore` refuses every
write, delete and clean-up once the lease is lost (the last check before a checkpoint's commit record
becomes visible), and the trainer stops at its next save with `LeaseLostError` (exit code 2).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Protocol

from core.errors import CheckpointError
from core.text import escaped, quoted
from training.checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)

LEASE_NAME = ".lease"
WAIT_VARIABLE = "RETRAIN_LEASE_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS = 90.0
# Every other rank waits for rank 0 at its next collective, which times out after 10 minutes.
MAX_WAIT_SECONDS = 480.0
BLOB_LEASE_SECONDS = 30  # Azure allows 15 to 60 s: a dead holder's lease frees within this
LOCAL_POLL_SECONDS = 0.2
BLOB_POLL_SECONDS = 2.0
_HOLDER_BYTES = 4096


class LeaseHeldError(CheckpointError):
    """Another attempt held the checkpoint location for longer than this one was willing to wait."""


class LeaseLostError(CheckpointError):
    """The lease could not be kept: another attempt may be writing the location now."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, for the person wondering why their attempt waits."""

    host: str
    pid: int
    launch_id: str
    since: str

    @classmethod
    def current(cls, launch_id: str) -> Holder:
        since = datetime.now(UTC).isoformat(timespec="seconds")
        return cls(socket.gethostname(), os.getpid(), launch_id, since)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Holder | None:
        """The holder a lease file or blob names; None if it names none (yet), or is not ours."""
        try:
            fields = json.loads(data)
            return cls(
                str(fields["host"]), int(fields["pid"]), str(fields["launch_id"]), str(fields["since"])
            )
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        # Read back from storage anyone may write: escaped and clipped, never trusted as one line.
        parts = (f"host {self.host}", f"pid {self.pid}", f"launch {self.launch_id}", f"since {self.since}")
        return ", ".join(escaped(part[:80]) for part in parts)


class CheckpointLease(Protocol):
    """The exclusive right to write one checkpoint location; `with lease:` holds it for the block."""

    @property
    def location(self) -> str:
        """The location, for messages; never contains a secret."""
        ...

    @property
    def lost(self) -> bool:
        """Whether a held lease could not be kept: its holder must stop writing."""
        ...

    def holder(self) -> Holder | None:
        """Whoever the storage names as the holder now (None if it names nobody)."""
        ...

    def acquire(self) -> CheckpointLease:
        """Take the lease, waiting up to the wait bound; raises `LeaseHeldError` after it."""
        ...

    def release(self) -> None: ...

    def __enter__(self) -> CheckpointLease: ...

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None: ...


def lease_wait_seconds(environ: Mapping[str, str]) -> float:
    """How long an attempt waits for a held lease: `RETRAIN_LEASE_WAIT_SECONDS`, or the default."""
    text = environ.get(WAIT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_WAIT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_WAIT_SECONDS:
        raise CheckpointError(
            f"{WAIT_VARIABLE}={quoted(text)}: expected a number of seconds from 0 (refuse at once) to "
            f"{MAX_WAIT_SECONDS:g} (the other ranks wait for rank 0 no longer than 10 minutes)"
        )
    return seconds


class WaitingLease:
    """What both twins share: waiting for the lease up to a deadline, and the context manager."""

    _expiry = ""  # when a dead holder's lease frees, for the refusal's advice

    def __init__(
        self,
        location: str,
        launch_id: str,
        wait_seconds: float,
        poll_seconds: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self._location = location
        self._launch_id = launch_id
        self.own: Holder | None = None  # who this lease says holds it, once held
        self._wait_seconds = wait_seconds
        self._poll_seconds = poll_seconds
        self._clock = clock
        self._sleep = sleep
        self._held = False

    @property
    def location(self) -> str:
        return self._location

    def acquire(self) -> WaitingLease:
        if self._held:
            raise RuntimeError(f"the checkpoint lease on {self._location} is already held by this object")
        deadline = self._clock() + self._wait_seconds
        waiting = False
        while not self._try_acquire():
            remaining = deadline - self._clock()
            if remaining <= 0:
                error = self._held_error()
                self._give_up()
                raise error
            if not waiting:
                waiting = True
                log.info(
                    "checkpoint location %s is held by %s; waiting up to %g s for it",
                    self._location,
                    self._describe_holder(),
                    self._wait_seconds,
                )
            self._sleep(min(self._poll_seconds, remaining))
        self._held = True
        log.debug("holding the checkpoint lease on %s", self._location)
        return self

    def release(self) -> None:
        if self._held:
            self._held = False
            self._release()

    def __enter__(self) -> WaitingLease:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()

    def holder(self) -> Holder | None:
        return Holder.from_bytes(self._read_holder())

    def _describe_holder(self) -> str:
        holder = self.holder()
        return holder.describe() if holder else "an attempt that has not named itself yet"

    def _claim(self) -> bytes:
        """Who holds the lease from now on, as the storage keeps it."""
        self.own = Holder.current(self._launch_id)
        return self.own.to_bytes()

    def _held_error(self) -> LeaseHeldError:
        return LeaseHeldError(
            f"checkpoint location {self._location} is held by another training attempt "
            f"({self._describe_holder()}) and was not released within {self._wait_seconds:g} s; wait for "
            f"that attempt to end, or end that process ({self._expiry}), then start again; "
            f"{WAIT_VARIABLE} sets how long to wait"
        )

    def _try_acquire(self) -> bool:
        raise NotImplementedError

    def _read_holder(self) -> bytes:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError

    def _give_up(self) -> None:
        """Let go of what waiting kept open."""


class LocalCheckpointLease(WaitingLease):
    """An exclusive flock on `<folder>/.lease`, which names the holder while it is held."""

    _expiry = "its lock frees the moment it exits"

    def __init__(
        self,
        folder: Path,
        launch_id: str,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        *,
        poll_seconds: float = LOCAL_POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(str(folder), launch_id, wait_seconds, poll_seconds, clock, sleep)
        self._path = Path(folder) / LEASE_NAME
        self._descriptor: int | None = None

    @property
    def lost(self) -> bool:
        # A flock lasts as long as its descriptor; it is lost only if someone removed or replaced the file,
        # after which another attempt could lock a new one.
        if not self._held or self._descriptor is None:
            return False
        return not self._is_the_file(self._descriptor)

    def _try_acquire(self) -> bool:
        descriptor = self._open()
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise self._failure("lock", err) from None
            return False
        if not self._is_the_file(descriptor):  # removed between our open and our lock: open it again
            self._close()
            return False
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, self._claim(), 0)
        except OSError as err:
            self._close()
            raise self._failure("write", err) from None
        return True

    def _read_holder(self) -> bytes:
        try:
            return os.pread(self._open(), _HOLDER_BYTES, 0)
        except OSError:
            return b""

    def _release(self) -> None:
        if self._descriptor is not None:
            try:
                os.ftruncate(self._descriptor, 0)  # it names nobody once released
            except OSError as err:
                log.warning("could not clear checkpoint lease file %s: %s", self._path, err.strerror)
        self._close()  # closing the descriptor releases the lock

    def _give_up(self) -> None:
        self._close()

    def _open(self) -> int:
        if self._descriptor is None:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._descriptor = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise self._failure("open", err) from None
        return self._descriptor

    def _close(self) -> None:
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            os.close(descriptor)

    def _is_the_file(self, descriptor: int) -> bool:
        try:
            found = os.stat(self._path)
        except OSError:
            return False
        opened = os.fstat(descriptor)
        return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)

    def _failure(self, action: str, err: OSError) -> CheckpointError:
        return CheckpointError(
            f"cannot {action} checkpoint lease file {self._path}: {err.strerror}; expected a writable folder"
        )


class LeasedStore:
    """A checkpoint store written only while its lease is kept: every write, delete and clean-up checks the
    lease first, so a writer that lost it never commits a checkpoint record (or prunes one) beside the attempt
    that took the location over. Reads, and anything outside the protocol, pass through."""

    def __init__(self, store: CheckpointStore, lease: CheckpointLease) -> None:
        self._store = store
        self.lease = lease

    @property
    def location(self) -> str:
        return self._store.location

    def check_held(self) -> None:
        if self.lease.lost:
            raise LeaseLostError(
                f"this training attempt lost its lease on checkpoint location {self.lease.location}, so "
                "another attempt may be writing there now; it stopped without writing more. Start it again "
                "once no other attempt trains on that location (it resumes from the last checkpoint)"
            )

    def writer(self, name: str) -> AbstractContextManager[BinaryIO]:
        self.check_held()
        return self._store.writer(name)

    def read(self, name: str) -> bytes:
        return self._store.read(name)

    def names(self) -> list[str]:
        return self._store.names()

    def delete(self, name: str) -> None:
        self.check_held()
        self._store.delete(name)

    def discard_incomplete(self) -> int:
        self.check_held()
        return self._store.discard_incomplete()

    def __getattr__(self, name: str) -> Any:
        # What the store offers beyond the protocol (its free space, its root) is the store's.
        return getattr(self._store, name)


def check_lease(store: CheckpointStore) -> None:
    """Raise `LeaseLostError` if `store` is written under a lease that was lost (none: nothing to lose)."""
    if isinstance(store, LeasedStore):
        store.check_held()
