"""A checkpoint store under a prefix of an Azure Blob Storage container (and Azurite, the emulator)."""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import BinaryIO, cast

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import BlobBlock, BlobClient, BlobPrefix, ContainerClient

from core.blob_urls import check_prefix
from core.errors import CheckpointError
from core.storage.azure_errors import AzureErrors, is_container_missing
from core.storage.blob import container_url, open_container
from training.checkpoint.store_protocol import (
    ObjectExistsError,
    ObjectNotFoundError,
    check_object_name,
    is_object_name,
)

log = logging.getLogger(__name__)

# Azure's answer to a block whose id length differs from the blob's other (uncommitted) blocks.
_MIXED_BLOCK_ID_LENGTHS = "InvalidBlobOrBlock"

DEFAULT_SPOOL_LIMIT_BYTES = 64 * 1024 * 1024
UPLOAD_CONCURRENCY = 4
CHECKPOINT_URL = "checkpoint store URL"  # how errors name the URL


class BlobCheckpointStore:
    """Objects are block blobs named `<prefix>/<name>`.

    A block blob becomes visible only when its block list commits, and the commit carries
    `If-None-Match: *`, so a crashed or losing writer never leaves a visible or overwritten object.
    The SDK stages blocks under random ids, so two writers racing for one name cannot mix their blocks.
    """

    def __init__(
        self,
        container: ContainerClient,
        prefix: str = "",
        *,
        spool_limit_bytes: int = DEFAULT_SPOOL_LIMIT_BYTES,
    ) -> None:
        self._container = container
        self._prefix = check_prefix(prefix, "checkpoint prefix", CheckpointError)
        self._folder = f"{self._prefix}/" if self._prefix else ""
        self._spool_limit_bytes = spool_limit_bytes

    @property
    def location(self) -> str:
        return container_url(self._container, self._prefix)

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def container_name(self) -> str:
        return self._container.container_name

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        blob = self._container.get_blob_client(self._blob_path(name))
        with self._storage_errors("check", name):
            if blob.exists():
                # Fail before the caller spends time serialising; the conditional commit still guards a race.
                raise self._exists_error(name)
        with tempfile.SpooledTemporaryFile(max_size=self._spool_limit_bytes, mode="w+b") as spool:
            yield cast(BinaryIO, spool)
            self._upload(blob, spool, name)

    def read(self, name: str) -> bytes:
        path = self._blob_path(name)
        with self._storage_errors("read", name):
            try:
                return self._container.download_blob(path, max_concurrency=UPLOAD_CONCURRENCY).readall()
            except ResourceNotFoundError as err:
                if is_container_missing(err):
                    raise
                raise ObjectNotFoundError(
                    f"checkpoint object {name!r} not found in {self.location}"
                ) from None

    def names(self) -> list[str]:
        with self._storage_errors("list"):
            listing = self._container.walk_blobs(name_starts_with=self._folder, delimiter="/")
            # walk_blobs yields a BlobPrefix for each subfolder; only direct children are objects.
            children = [
                item.name[len(self._folder) :] for item in listing if not isinstance(item, BlobPrefix)
            ]
        return sorted(child for child in children if is_object_name(child))

    def delete(self, name: str) -> None:
        path = self._blob_path(name)
        with self._storage_errors("delete", name):
            try:
                self._container.delete_blob(path, delete_snapshots="include")
            except ResourceNotFoundError as err:
                if is_container_missing(err):
                    raise

    def discard_incomplete(self) -> int:
        # Nothing to do: blocks staged by a write that never committed are invisible to list and read, do not
        # block a later write of the same name (see `_upload`), and Azure garbage-collects them after a week.
        return 0

    def free_bytes(self) -> int | None:
        # A storage account has no quota a client could read (its limit, 5 PiB by default, is the service's),
        # so only writability can be checked before training.
        return None

    def _upload(self, blob: BlobClient, spool: tempfile.SpooledTemporaryFile[bytes], name: str) -> None:
        length = spool.seek(0, os.SEEK_END)
        spool.seek(0)
        with self._storage_errors("write", name):
            try:
                blob.upload_blob(spool, length=length, overwrite=False, max_concurrency=UPLOAD_CONCURRENCY)
            except ResourceExistsError:
                if blob.exists():
                    raise self._exists_error(name) from None
                # Put Blob with If-None-Match: * may count the staged blocks of an upload that died before
                # committing as an existing blob (Azurite does); Put Block List counts only committed ones.
                self._commit_as_one_block(blob, spool, length, name)
            except HttpResponseError as err:
                if getattr(err, "error_code", None) != _MIXED_BLOCK_ID_LENGTHS:
                    raise
                # Blocks left by an upload that died under another SDK version, whose block ids have
                # another length: stage one block with an id of their length instead.
                self._commit_as_one_block(blob, spool, length, name)
        log.debug("published checkpoint object %s in %s (%d bytes)", name, self.location, length)

    def _commit_as_one_block(
        self, blob: BlobClient, spool: tempfile.SpooledTemporaryFile[bytes], length: int, name: str
    ) -> None:
        block_id = self._block_id_like_leftovers(blob)
        spool.seek(0)
        blob.stage_block(block_id, spool, length=length)
        try:
            blob.commit_block_list([BlobBlock(block_id)], match_condition=MatchConditions.IfMissing)
        except (ResourceExistsError, ResourceModifiedError):
            raise self._exists_error(name) from None

    @staticmethod
    def _block_id_like_leftovers(blob: BlobClient) -> str:
        # All block ids of one blob, committed or not, must have the same length.
        _, uncommitted = blob.get_block_list("uncommitted")
        width = len(uncommitted[0].id) if uncommitted else 48
        return f"{uuid.uuid4().int:0{width}d}"[-width:]

    def _blob_path(self, name: str) -> str:
        return self._folder + check_object_name(name)

    def _exists_error(self, name: str) -> ObjectExistsError:
        return ObjectExistsError(
            f"checkpoint object {name!r} already exists in {self.location}; objects are never overwritten, "
            "write under a new name"
        )

    def _storage_errors(self, action: str, name: str | None = None) -> AbstractContextManager[None]:
        """Azure failures the user must fix as one-line, secret-free `CheckpointError`s naming the object;
        transient ones (network, throttling, 5xx) keep their Azure type, so that callers can retry them."""
        target = f"checkpoint object {name!r} in" if name else "checkpoint store"
        return AzureErrors(
            lambda action, reason: CheckpointError(f"cannot {action} {target} {self.location}: {reason}"),
            lambda: CheckpointError(
                f"the container of checkpoint store {self.location} does not exist; create it first "
                "(the store never creates containers)"
            ),
        ).translated(action)


def open_blob_store(url: str, connection_string: str | None = None) -> BlobCheckpointStore:
    """A store for `url`, authenticated by `connection_string` if given, else by `DefaultAzureCredential`.

    The connection string is meant for Azurite and development; in Azure the managed identity is used.
    """
    container, prefix = open_container(url, connection_string, CHECKPOINT_URL, CheckpointError)
    return BlobCheckpointStore(container, prefix)
