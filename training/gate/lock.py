"""Mutual exclusion for the registry's compare-and-set: whoever moves the `champion` alias holds the lock.

MLflow's registry has no conditional alias update, so "re-read the champion, decide, move the alias" is made
atomic by a lock that every process changing the aliases takes first: an flock'ed file under the local state
folder for the local SQLite store, and a Blob Storage lease for Azure ML, where registering jobs run on
different machines. Both are released by the system when their holder dies: the kernel drops a dead
process's flock, and a lease that is no longer renewed expires.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from core.errors import InputError, RetrainError

if TYPE_CHECKING:
    from azure.storage.blob import BlobClient, BlobLeaseClient

log = logging.getLogger(__name__)

DEFAULT_WAIT_SECONDS = 600.0
LEASE_SECONDS = 60  # Azure allows 15-60 s (or infinite, which a crashed holder would never give back)
_FIRST_POLL_SECONDS = 0.05
_MAX_POLL_SECONDS = 1.0
_BLOB_SCHEMES = ("https://", "http://")
LOCK_URL = "registry lock URL"


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


def _timeout(location: str, wait_seconds: float) -> LockTimeoutError:
    return LockTimeoutError(
        f"registry lock {location} is still held by another registration after {wait_seconds:g} s; "
        "wait for it to finish (see the holder's logs), or raise the wait"
    )


class FileLock:
    """An exclusive `flock` on a file: for processes sharing one machine's local state folder."""

    def __init__(self, path: Path, wait_seconds: float = DEFAULT_WAIT_SECONDS) -> None:
        self._path = Path(path)
        self._wait_seconds = wait_seconds
        self._descriptor: int | None = None

    @property
    def location(self) -> str:
        return str(self._path)

    def __enter__(self) -> FileLock:
        if self._descriptor is not None:
            raise RuntimeError(f"registry lock {self._path} is already held by this object")
        self._path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._acquire(descriptor)
            _write_holder(descriptor)
        except BaseException:
            os.close(descriptor)
            raise
        self._descriptor = descriptor
        log.debug("holding registry lock %s", self._path)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            os.close(descriptor)

    def _acquire(self, descriptor: int) -> None:
        deadline = time.monotonic() + self._wait_seconds
        next_interval = _poll_intervals()
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _timeout(self.location, self._wait_seconds) from None
                time.sleep(min(next_interval(), remaining))


def _write_holder(descriptor: int) -> None:
    """Who holds the lock, for a person wondering why a registration waits."""
    holder = f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(UTC).isoformat()}\n"
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, holder.encode(), 0)


class BlobLeaseLock:
    """An exclusive lease on a lock blob: for registering jobs on different machines (Azure ML).

    The lease lasts `lease_seconds` and a background thread renews it while the lock is held, so a holder
    that dies stops renewing and the next registration gets the lock at most `lease_seconds` later.
    """

    def __init__(
        self,
        blob: BlobClient,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        lease_seconds: int = LEASE_SECONDS,
    ) -> None:
        if not 15 <= lease_seconds <= 60:
            raise InputError(f"lease of {lease_seconds} s: Azure leases last 15 to 60 seconds")
        self._blob = blob
        self._wait_seconds = wait_seconds
        self._lease_seconds = lease_seconds
        self._lease: BlobLeaseClient | None = None
        self._stop_renewing = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def location(self) -> str:
        return self._blob.url.split("?", 1)[0]

    def __enter__(self) -> BlobLeaseLock:
        if self._lease is not None:
            raise RuntimeError(f"registry lock {self.location} is already held by this object")
        with _storage_errors("create", self.location):
            self._create_lock_blob()
        with _storage_errors("lease", self.location):
            self._lease = self._acquire()
        self._stop_renewing.clear()
        self._renewer = threading.Thread(target=self._renew, name="registry-lock-renewal", daemon=True)
        self._renewer.start()
        log.debug("holding registry lock %s", self.location)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        from azure.core.exceptions import AzureError

        lease, self._lease = self._lease, None
        if lease is None:
            return
        self._stop_renewing.set()
        if self._renewer is not None:
            self._renewer.join()
        try:
            lease.release()
        except AzureError as failure:
            # Not fatal: the lease expires by itself within lease_seconds.
            log.warning(
                "could not release registry lock %s (%s); it frees itself within %d s",
                self.location,
                _describe(failure),
                self._lease_seconds,
            )

    def _create_lock_blob(self) -> None:
        from azure.core.exceptions import HttpResponseError, ResourceExistsError

        if self._blob.exists():
            return
        try:
            self._blob.upload_blob(b"", overwrite=False)
        except ResourceExistsError:
            return  # another registration created it first: that is all we wanted
        except HttpResponseError as failure:
            if failure.status_code != 412:  # it exists and is leased already
                raise

    def _acquire(self) -> BlobLeaseClient:
        from azure.core.exceptions import HttpResponseError

        deadline = time.monotonic() + self._wait_seconds
        next_interval = _poll_intervals()
        while True:
            try:
                return self._blob.acquire_lease(lease_duration=self._lease_seconds)
            except HttpResponseError as failure:
                if failure.status_code != 409:  # 409 LeaseAlreadyPresent: someone else holds it
                    raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _timeout(self.location, self._wait_seconds)
            time.sleep(min(next_interval(), remaining))

    def _renew(self) -> None:
        from azure.core.exceptions import AzureError

        while not self._stop_renewing.wait(self._lease_seconds / 3):
            lease = self._lease
            if lease is None:
                return
            try:
                lease.renew()
            except AzureError as failure:
                log.error("could not renew registry lock %s: %s", self.location, _describe(failure))


@contextmanager
def _storage_errors(action: str, location: str) -> Iterator[None]:
    """Turn an Azure failure into a one-line, secret-free error naming the lock blob."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    try:
        yield
    except ResourceNotFoundError as error:
        if getattr(error, "error_code", None) == "ContainerNotFound":
            raise InputError(
                f"registry lock {location}: its container does not exist; create it first"
            ) from None
        raise InputError(f"cannot {action} registry lock {location}: {_describe(error)}") from None
    except AzureError as error:
        raise InputError(f"cannot {action} registry lock {location}: {_describe(error)}") from None


def _describe(error: BaseException) -> str:
    from azure.core.exceptions import HttpResponseError

    from core.secrets import mask_secrets

    if isinstance(error, HttpResponseError) and error.status_code is not None:
        code = getattr(error, "error_code", None) or "no error code"
        return mask_secrets(f"HTTP {error.status_code} {error.reason or ''} ({code})")
    lines = str(error).strip().splitlines()
    return mask_secrets(lines[0] if lines else type(error).__name__)[:300]


def lock_name(model_name: str) -> str:
    return f"{model_name}.lock"


def open_registry_lock(
    spec: str, model_name: str, environ: Mapping[str, str], wait_seconds: float = DEFAULT_WAIT_SECONDS
) -> RegistryLock:
    """The lock for `model_name` under `spec`: a folder (FileLock) or a blob URL prefix (BlobLeaseLock).

    A blob lock authenticates with RETRAIN_STORAGE_CONNECTION_STRING when set (Azurite, development), and
    with DefaultAzureCredential otherwise (the job's managed identity in Azure ML).
    """
    if not spec.strip():
        raise InputError(
            "--lock '': expected a folder, or https://<account>.blob.core.windows.net/<container>"
        )
    if not spec.startswith(_BLOB_SCHEMES):
        return FileLock(Path(spec) / lock_name(model_name), wait_seconds)
    from training.checkpoint.blob_store import open_container
    from training.checkpoint.stores import CONNECTION_STRING_VARIABLE

    container, prefix = open_container(spec, environ.get(CONNECTION_STRING_VARIABLE) or None, LOCK_URL)
    name = f"{prefix}/{lock_name(model_name)}" if prefix else lock_name(model_name)
    return BlobLeaseLock(container.get_blob_client(name), wait_seconds)
