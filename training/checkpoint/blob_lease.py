"""The checkpoint lease in Azure Blob Storage (and Azurite): a blob lease on `<prefix>/.lease`.

The lease lasts BLOB_LEASE_SECONDS and a thread renews it every third of that while it is held
(core.locks.LeaseRenewal); the blob's content names the holder. A holder that dies stops renewing, so
its lease expires and the next attempt takes it over. See training/checkpoint/lease.py for the protocol.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from azure.core.exceptions import AzureError, HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import BlobLeaseClient, ContainerClient

from core.errors import CheckpointError
from core.locks import LeaseRenewal
from core.secrets import mask_secrets
from training.checkpoint.blob_store import _describe  # the store's own wording of a failure, masked
from training.checkpoint.lease import (
    BLOB_LEASE_SECONDS,
    BLOB_POLL_SECONDS,
    DEFAULT_WAIT_SECONDS,
    LEASE_NAME,
    WaitingLease,
)

log = logging.getLogger(__name__)


class BlobCheckpointLease(WaitingLease):
    """A blob lease on `<prefix>/.lease` in a container that exists; the blob's content names the holder."""

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
        if not 15 <= lease_seconds <= 60:
            raise CheckpointError(f"a blob lease of {lease_seconds} s: Azure leases last 15 to 60 s")
        container_url = mask_secrets(container.url.split("?", 1)[0])
        location = f"{container_url}/{prefix}" if prefix else container_url
        super().__init__(location, launch_id, wait_seconds, poll_seconds, clock, sleep)
        self._blob = container.get_blob_client(f"{prefix}/{LEASE_NAME}" if prefix else LEASE_NAME)
        self._client = BlobLeaseClient(self._blob)
        self._lease_seconds = lease_seconds
        self._expiry = f"its lease then expires within {lease_seconds} s"
        self._created = False
        self._renewal: LeaseRenewal | None = None

    @property
    def lost(self) -> bool:
        return self._renewal is not None and self._renewal.lost

    def _try_acquire(self) -> bool:
        with self._storage_errors("take"):
            self._create_lease_blob()
            try:
                self._client.acquire(lease_duration=self._lease_seconds)
            except HttpResponseError as err:
                if err.status_code == 409:  # LeaseAlreadyPresent: another attempt holds it
                    return False
                raise
        try:
            with self._storage_errors("name the holder of"):
                self._blob.upload_blob(self._claim(), overwrite=True, lease=self._client)
        except CheckpointError:
            self._release_lease()
            raise
        self._renewal = LeaseRenewal(
            self._client.renew,
            self._lease_seconds / 3,
            self._lease_seconds,
            f"the checkpoint lease on {self.location}",
            _reason,
        )
        return True

    def _create_lease_blob(self) -> None:
        if self._created or self._blob.exists():
            self._created = True
            return
        try:
            self._blob.upload_blob(b"", overwrite=False)  # If-None-Match: *, so a racing creator loses
        except ResourceExistsError:
            pass
        except HttpResponseError as err:
            if err.status_code != 412:  # it exists, and is leased already
                raise
        self._created = True

    def _read_holder(self) -> bytes:
        try:
            return self._blob.download_blob().readall()
        except AzureError:
            return b""

    def _release(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            renewal.stop()
            if renewal.lost:
                return  # nothing left to release
        self._release_lease()

    def _release_lease(self) -> None:
        try:
            self._client.release()
        except AzureError as err:
            log.warning(
                "could not release the checkpoint lease on %s (%s); it expires within %d s",
                self.location,
                _reason(err),
                self._lease_seconds,
            )

    @contextmanager
    def _storage_errors(self, action: str) -> Iterator[None]:
        """Azure failures as one-line, secret-free `CheckpointError`s naming the location."""
        try:
            yield
        except ResourceNotFoundError as err:
            if getattr(err, "error_code", None) == "ContainerNotFound":
                raise CheckpointError(
                    f"the container of checkpoint location {self.location} does not exist; create it first "
                    "(the store never creates containers)"
                ) from None
            raise self._failure(action, err) from None
        except AzureError as err:
            raise self._failure(action, err) from None

    def _failure(self, action: str, err: AzureError) -> CheckpointError:
        return CheckpointError(f"cannot {action} the checkpoint lease on {self.location}: {_reason(err)}")


def _reason(err: BaseException) -> str:
    return _describe(err) if isinstance(err, AzureError) else type(err).__name__
