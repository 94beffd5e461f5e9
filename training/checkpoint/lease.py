"""One writer per run: a training attempt holds a lease on its checkpoint location while it trains.

Rank 0 takes the lease before it touches the location (before clearing a crashed write's leftovers, which is
safe only when nobody else writes there) and holds it until its checkpointer is closed. A second attempt on
the same location waits for it, up to `RETRAIN_LEASE_WAIT_SECONDS` (default 90 s: longer than a dead
holder's blob lease takes to expire, so a retried Azure ML job takes over from the one that died), and is
then refused in one line naming the holder:

    retrain: error: checkpoint location L is held by another training attempt (host H, pid P, launch I,
    since T) and was not released within 90 s; wait for that attempt to end, or end that process, ...

(exit code 2, nothing written). The lease is the storage seam's (core/storage/leases.py), on `.lease` in the
location, which holds the holder as JSON:
- a local folder: an exclusive `flock` on its hidden `.lease` file. The kernel releases the lock the moment
  its process dies, however it dies. A flock is per machine: a folder mounted on several nodes needs the
  Blob location for a lease that holds across nodes.
- Azure Blob Storage: a blob lease (30 s) on `<prefix>/.lease`, renewed by a thread every third of its
  duration. A holder that dies stops renewing, and its lease expires: the next attempt takes it over.
Object names never start with '.', so `.lease` is never listed, read or pruned as a checkpoint.

A lease that could not be renewed is `lost`: the attempt may no longer write. `LeasedStore` refuses every
write, delete and clean-up once the lease is lost (the last check before a checkpoint's commit record
becomes visible), and the trainer stops at its next save with `LeaseLostError` (exit code 2).
"""

from __future__ import annotations

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
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from core.errors import CheckpointError
from core.storage.leases import Lease, take_within
from core.storage.local import LocalLease
from core.text import escaped, quoted
from training.checkpoint.store_protocol import CheckpointStore

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

log = logging.getLogger(__name__)

LEASE_NAME = ".lease"
WAIT_VARIABLE = "RETRAIN_LEASE_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS = 90.0
# Every other rank waits for rank 0 at its next collective, which times out after 10 minutes.
MAX_WAIT_SECONDS = 480.0
BLOB_LEASE_SECONDS = 30  # Azure allows 15 to 60 s: a dead holder's lease frees within this
LOCAL_POLL_SECONDS = 0.2
BLOB_POLL_SECONDS = 2.0


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
    """A checkpoint lease on the seam's lease `storage_lease`: waiting for it up to a deadline, naming the
    holder, and the context manager. `expiry` says when a dead holder's lease frees, for the refusal."""

    def __init__(
        self,
        storage_lease: Lease,
        location: str,
        launch_id: str,
        wait_seconds: float,
        poll_seconds: float,
        expiry: str,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.storage_lease = storage_lease
        self._location = location
        self._launch_id = launch_id
        self.own: Holder | None = None  # who this lease says holds it, once held
        self._wait_seconds = wait_seconds
        self._poll_seconds = poll_seconds
        self._expiry = expiry
        self._clock = clock
        self._sleep = sleep
        self._held = False

    @property
    def location(self) -> str:
        return self._location

    @property
    def lost(self) -> bool:
        return self._held and self.storage_lease.lost

    def acquire(self) -> WaitingLease:
        if self._held:
            raise RuntimeError(f"the checkpoint lease on {self._location} is already held by this object")

        def on_wait() -> None:
            log.info(
                "checkpoint location %s is held by %s; waiting up to %g s for it",
                self._location,
                self._describe_holder(),
                self._wait_seconds,
            )

        taken = take_within(
            self.storage_lease,
            self._claim,
            self._wait_seconds,
            lambda: self._poll_seconds,
            clock=self._clock,
            sleep=self._sleep,
            on_wait=on_wait,
        )
        if not taken:
            raise self._held_error()
        self._held = True
        log.debug("holding the checkpoint lease on %s", self._location)
        return self

    def release(self) -> None:
        if self._held:
            self._held = False
            self.storage_lease.release()

    def __enter__(self) -> WaitingLease:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()

    def holder(self) -> Holder | None:
        held = self.storage_lease.holder()
        return None if held is None else Holder.from_bytes(held.stamp)

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


class LocalCheckpointLease(WaitingLease):
    """The lease on the local folder `folder`: an exclusive flock on `<folder>/.lease`."""

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
        storage_lease = LocalLease(Path(folder) / LEASE_NAME, "checkpoint lease file", CheckpointError)
        expiry = "its lock frees the moment it exits"
        super().__init__(
            storage_lease, str(folder), launch_id, wait_seconds, poll_seconds, expiry, clock, sleep
        )


class BlobCheckpointLease(WaitingLease):
    """The lease on `<prefix>/` in a container that exists: a blob lease on `<prefix>/.lease`."""

    def __init__(
        self,
        container: ContainerClient,
        prefix: str,
        launch_id: str,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        *,
        lease_seconds: int = BLOB_LEASE_SECONDS,
        poll_seconds: float = BLOB_POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from core.storage.azure_errors import AzureErrors  # the Blob SDK, only where the location is
        from core.storage.blob import BlobLease, container_url

        location = container_url(container, prefix)
        errors = AzureErrors(
            lambda action, why: CheckpointError(f"cannot {action} the checkpoint lease on {location}: {why}"),
            lambda: CheckpointError(
                f"the container of checkpoint location {location} does not exist; create it first "
                "(the store never creates containers)"
            ),
            keep_transient=False,
        )
        blob = container.get_blob_client(f"{prefix}/{LEASE_NAME}" if prefix else LEASE_NAME)
        storage_lease = BlobLease(
            blob, lease_seconds, f"the checkpoint lease on {location}", errors, CheckpointError
        )
        expiry = f"its lease then expires within {lease_seconds} s"
        super().__init__(storage_lease, location, launch_id, wait_seconds, poll_seconds, expiry, clock, sleep)


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
