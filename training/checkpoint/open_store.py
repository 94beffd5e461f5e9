"""Open the checkpoint store a spec names (a Blob Storage URL or a local folder), or the lease that gives
one attempt at a time the right to write it, and read its newest record.

Nothing here imports torch: the launcher uses it to check a resume before it starts any worker.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from core.errors import CheckpointError
from core.storage.locations import CONNECTION_STRING_VARIABLE, parse_location
from training.checkpoint.lease import (
    BlobCheckpointLease,
    CheckpointLease,
    LocalCheckpointLease,
    lease_wait_seconds,
)
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import RECORD_SUFFIX, CheckpointRecord, committed_checkpoints
from training.checkpoint.store_protocol import CheckpointStore

log = logging.getLogger(__name__)

CHECKPOINT_STORE = "checkpoint store"  # how a refused spec is named


def open_checkpoint_store(spec: str, environ: Mapping[str, str]) -> CheckpointStore:
    """A Blob Storage URL opens a blob store, a folder (or file://) a local one (core/storage/locations.py).

    The blob store authenticates with the connection string in `RETRAIN_STORAGE_CONNECTION_STRING` when it
    is set (Azurite, development) and with `DefaultAzureCredential` otherwise (managed identity in Azure).
    """
    location = parse_location(spec, CHECKPOINT_STORE, CheckpointError)
    if location.folder is not None:
        return LocalCheckpointStore(location.folder)
    # Imported here so that a local-only run never pays for the Azure SDK.
    from training.checkpoint.blob_store import open_blob_store

    return open_blob_store(spec, environ.get(CONNECTION_STRING_VARIABLE) or None)


def open_checkpoint_lease(spec: str, environ: Mapping[str, str], launch_id: str) -> CheckpointLease:
    """The lease on the location `spec` names, for the attempt `launch_id`, not yet taken: a blob lease for a
    Blob Storage URL (authenticated as `open_checkpoint_store` does), a file lock in a local folder. It waits
    `RETRAIN_LEASE_WAIT_SECONDS` (training/checkpoint/lease.py) for a holder to let go."""
    wait_seconds = lease_wait_seconds(environ)
    location = parse_location(spec, CHECKPOINT_STORE, CheckpointError)
    if location.folder is not None:
        return LocalCheckpointLease(location.folder, launch_id, wait_seconds)
    from training.checkpoint.blob_store import CHECKPOINT_URL

    container, prefix = location.container(environ, CHECKPOINT_URL, CheckpointError)
    return BlobCheckpointLease(container, prefix, launch_id, wait_seconds)


def newest_record(store: CheckpointStore) -> CheckpointRecord | None:
    """The newest readable commit record, without fetching any checkpoint data."""
    for name in committed_checkpoints(store.names()):
        try:
            return CheckpointRecord.from_bytes(store.read(name + RECORD_SUFFIX), name)
        except CheckpointError as error:
            log.warning("skipping checkpoint record %s in %s: %s", name, store.location, error)
    return None
