"""Mutual exclusion for the registry's compare-and-set: whoever moves the `champion` alias holds the lock.

MLflow's registry has no conditional alias update, so "re-read the champion, decide, move the alias" is made
atomic by a lock that every process changing the aliases takes first: an flock'ed file under the local state
folder for the local SQLite store, and a Blob Storage lease for Azure ML, where registering jobs run on
different machines. Both are released by the system when their holder dies: the kernel drops a dead
process's flock, and a lease that is no longer renewed expires.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from core.errors import CheckpointError, InputError, RetrainError
from core.storage.leases import Lease, take_within
from core.storage.local import LocalLease
from core.storage.locations import parse_location

if TYPE_CHECKING:
    from azure.storage.blob import BlobClient

log = logging.getLogger(__name__)

DEFAULT_WAIT_SECONDS = 600.0
LEASE_SECONDS = 60  # Azure allows 15-60 s (or infinite, which a crashed holder would never give back)
_FIRST_POLL_SECONDS = 0.05
_MAX_POLL_SECONDS = 1.0
LOCK_URL = "registry lock URL"
EXPECTED_LOCK = "a folder, or https://<account>.blob.core.windows.net/<container>"


class LockTimeoutError(RetrainError):
    """Another process held the registry lock for longer than this one was willing to wait."""


class RegistryLock(Protocol):
    """A context manager that holds an exclusive lock between `__enter__` and `__exit__`."""

    @property
    def location(self) -> str: ...

    def __enter__(self) -> RegistryLock: ...

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None: ...


def _poll_intervals() -> Callable[[], float]:
    """Waits between attempts: short at first (registrations are quick), then backing off."""
    interval = _FIRST_POLL_SECONDS

    def next_interval() -> float:
        nonlocal interval
        current, interval = interval, min(interval * 2, _MAX_POLL_SECONDS)
        return current

    return next_interval


def _holder() -> bytes:
    """Who holds the lock, for a person wondering why a registration waits."""
    return f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(UTC).isoformat()}\n".encode()


class LeaseLock:
    """The registry lock on the storage seam's lease `storage_lease` (core/storage/leases.py), waited for up
    to `wait_seconds`."""

    def __init__(self, storage_lease: Lease, wait_seconds: float = DEFAULT_WAIT_SECONDS) -> None:
        self._lease = storage_lease
        self._wait_seconds = wait_seconds
        self._held = False

    @property
    def location(self) -> str:
        return self._lease.location

    def __enter__(self) -> LeaseLock:
        if self._held:
            raise RuntimeError(f"registry lock {self.location} is already held by this object")
        if not take_within(self._lease, _holder, self._wait_seconds, _poll_intervals()):
            raise LockTimeoutError(
                f"registry lock {self.location} is still held by another registration after "
                f"{self._wait_seconds:g} s; wait for it to finish (see the holder's logs), or raise the wait"
            )
        self._held = True
        log.debug("holding registry lock %s", self.location)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._held:
            self._held = False
            self._lease.release()


class FileLock(LeaseLock):
    """An exclusive `flock` on a file: for processes sharing one machine's local state folder."""

    def __init__(self, path: Path, wait_seconds: float = DEFAULT_WAIT_SECONDS) -> None:
        super().__init__(LocalLease(Path(path), "registry lock", InputError), wait_seconds)


class BlobLeaseLock(LeaseLock):
    """An exclusive lease on a lock blob: for registering jobs on different machines (Azure ML).

    The lease lasts `lease_seconds` and a background thread renews it while the lock is held, so a holder
    that dies stops renewing and the next registration gets the lock at most `lease_seconds` later.
    """

    def __init__(
        self, blob: BlobClient, wait_seconds: float = DEFAULT_WAIT_SECONDS, lease_seconds: int = LEASE_SECONDS
    ) -> None:
        from core.storage.azure_errors import AzureErrors  # the Blob SDK, only where the lock is
        from core.storage.blob import BlobLease

        location = blob.url.split("?", 1)[0]
        errors = AzureErrors(
            lambda action, why: InputError(f"cannot {action} registry lock {location}: {why}"),
            lambda: InputError(f"registry lock {location}: its container does not exist; create it first"),
            keep_transient=False,
        )
        lease = BlobLease(blob, lease_seconds, f"registry lock {location}", errors, InputError)
        super().__init__(lease, wait_seconds)


def lock_name(model_name: str) -> str:
    return f"{model_name}.lock"


def open_registry_lock(
    spec: str, model_name: str, environ: Mapping[str, str], wait_seconds: float = DEFAULT_WAIT_SECONDS
) -> RegistryLock:
    """The lock for `model_name` under `spec`: a folder (FileLock) or a blob URL prefix (BlobLeaseLock),
    picked by core/storage/locations.py.

    A blob lock authenticates with RETRAIN_STORAGE_CONNECTION_STRING when set (Azurite, development), and
    with DefaultAzureCredential otherwise (the job's managed identity in Azure ML).
    """
    if not spec.strip():
        raise InputError(f"--lock '': expected {EXPECTED_LOCK}")
    location = parse_location(spec, "--lock", InputError, EXPECTED_LOCK)
    if location.folder is not None:
        return FileLock(location.folder / lock_name(model_name), wait_seconds)
    # A URL the lock cannot use is refused as a checkpoint store URL is, by the same opener.
    container, prefix = location.container(environ, LOCK_URL, CheckpointError)
    name = f"{prefix}/{lock_name(model_name)}" if prefix else lock_name(model_name)
    return BlobLeaseLock(container.get_blob_client(name), wait_seconds)
