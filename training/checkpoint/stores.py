"""Open the checkpoint store a spec names (a Blob Storage URL or a local folder), or the lease that gives
one attempt at a time the right to write it, and read its newest record.

Nothing here imports torch: the launcher uses it to check a resume before it starts any worker.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

from core.errors import CheckpointError
from core.secrets import displayable_url
from core.text import quoted
from training.checkpoint.lease import CheckpointLease, LocalCheckpointLease, lease_wait_seconds
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import RECORD_SUFFIX, CheckpointRecord, committed_checkpoints
from training.checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)

CONNECTION_STRING_VARIABLE = "RETRAIN_STORAGE_CONNECTION_STRING"
_BLOB_SCHEMES = ("https://", "http://")
_ANY_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def open_checkpoint_store(spec: str, environ: Mapping[str, str]) -> CheckpointStore:
    """A Blob Storage URL opens a blob store, anything else a local folder.

    The blob store authenticates with the connection string in `RETRAIN_STORAGE_CONNECTION_STRING` when it
    is set (Azurite, development) and with `DefaultAzureCredential` otherwise (managed identity in Azure).
    """
    if _is_blob_url(spec):
        # Imported here so that a local-only run never pays for the Azure SDK.
        from training.checkpoint.blob_store import open_blob_store

        return open_blob_store(spec, environ.get(CONNECTION_STRING_VARIABLE) or None)
    return LocalCheckpointStore(Path(spec))


def open_checkpoint_lease(spec: str, environ: Mapping[str, str], launch_id: str) -> CheckpointLease:
    """The lease on the location `spec` names, for the attempt `launch_id`, not yet taken: a blob lease for a
    Blob Storage URL (authenticated as `open_checkpoint_store` does), a file lock in a local folder. It waits
    `RETRAIN_LEASE_WAIT_SECONDS` (training/checkpoint/lease.py) for a holder to let go."""
    wait_seconds = lease_wait_seconds(environ)
    if _is_blob_url(spec):
        from training.checkpoint.blob_lease import BlobCheckpointLease
        from training.checkpoint.blob_store import open_container

        container, prefix = open_container(spec, environ.get(CONNECTION_STRING_VARIABLE) or None)
        return BlobCheckpointLease(container, prefix, launch_id, wait_seconds)
    return LocalCheckpointLease(Path(spec), launch_id, wait_seconds)


def _is_blob_url(spec: str) -> bool:
    """Whether `spec` is a Blob Storage URL; a spec that is neither that nor a local path is refused."""
    if spec.startswith(_BLOB_SCHEMES):
        return True
    if not spec.strip() or _ANY_SCHEME.match(spec):
        raise CheckpointError(
            f"checkpoint store {quoted(displayable_url(spec), 120)} is not supported; expected a local "
            "folder path or https://<account>.blob.core.windows.net/<container>/<prefix>"
        )
    return False


def newest_record(store: CheckpointStore) -> CheckpointRecord | None:
    """The newest readable commit record, without fetching any checkpoint data."""
    for name in committed_checkpoints(store.names()):
        try:
            return CheckpointRecord.from_bytes(store.read(name + RECORD_SUFFIX), name)
        except CheckpointError as error:
            log.warning("skipping checkpoint record %s in %s: %s", name, store.location, error)
    return None
