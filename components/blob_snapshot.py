"""Data versions from Blob Storage: a manifest of blob eTags, and an immutable server-side snapshot of it.

A blob's eTag changes whenever its content does, so the manifest of a prefix (every raw blob's name, size
and eTag) identifies the data exactly, and its content hash is the data version (components/data_version).
The snapshot copies each listed blob, server-side, into `<snapshots>/<version>/<name>` on the condition
that the source still carries the listed eTag: a blob replaced mid-snapshot fails the snapshot instead of
mixing two versions of the data. The manifest is written last, as `<snapshots>/<version>.manifest.json`;
its presence marks the snapshot complete, so a repeated snapshot of the same data reuses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from components.data_version import (
    RAW_SUFFIXES,
    DataError,
    DataFile,
    DataManifest,
    is_raw_name,
)
from core.secrets import mask_secrets
from core.versions import MANIFEST_SUFFIX

if TYPE_CHECKING:
    from azure.storage.blob import BlobClient, ContainerClient

log = logging.getLogger(__name__)

ETAG_PREFIX = "etag:"
COPY_TIMEOUT_S = 600.0
_COPY_POLL_FIRST_S = 0.5
_COPY_POLL_MAX_S = 10.0


def folder_prefix(prefix: str) -> str:
    """'landing/digits' and 'landing/digits/' both name the folder 'landing/digits/'; '' is the root."""
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


def manifest_of_blob_prefix(
    container_client: ContainerClient, prefix: str, suffixes: tuple[str, ...] = RAW_SUFFIXES, depth: int = 1
) -> DataManifest:
    """The manifest of the raw blobs under `prefix`: the task's suffixes, directly under it (depth 1) or
    also in class folders (depth 2; components/data_version.is_raw_name). Empty blobs are skipped."""
    prefix = folder_prefix(prefix)
    where = f"{container_client.url}/{prefix}"
    files = []
    for blob in container_client.list_blobs(name_starts_with=prefix):
        name = blob.name[len(prefix) :]
        if not is_raw_name(name, suffixes, depth):
            continue  # too deep (another folder's, or a snapshot's), or not raw data: not part of this data
        if not blob.size:
            log.warning("skipping empty blob %s%s: an empty batch holds no data", where, name)
            continue
        etag = str(blob.etag).strip('"')
        source = container_client.get_blob_client(blob.name).url
        files.append(
            DataFile(name=name, size=int(blob.size), fingerprint=f"{ETAG_PREFIX}{etag}", source=source)
        )
    if not files:
        raise DataError(
            f"data {where}: no non-empty {' or '.join(suffixes)} blobs; expected the task's raw files there"
        )
    return DataManifest(tuple(files))


def snapshot_paths(snapshots_prefix: str, version: str) -> tuple[str, str]:
    """(the snapshot's folder prefix, its manifest blob name) for a data version."""
    root = folder_prefix(snapshots_prefix)
    if not root:
        raise DataError("snapshots prefix is empty; expected a folder such as 'retrain/snapshots/digits'")
    return f"{root}{version}/", f"{root}{version}{MANIFEST_SUFFIX}"


def _etag_of(entry: DataFile) -> str:
    if not entry.fingerprint.startswith(ETAG_PREFIX):
        raise DataError(
            f"{entry.name}: fingerprint {entry.fingerprint!r}; a blob snapshot needs 'etag:<etag>' ones"
        )
    return f'"{entry.fingerprint.removeprefix(ETAG_PREFIX)}"'


def _existing_snapshot(container_client: ContainerClient, manifest_name: str, version: str) -> bool:
    from azure.core.exceptions import ResourceNotFoundError

    try:
        text = container_client.get_blob_client(manifest_name).download_blob(encoding="utf-8").readall()
    except ResourceNotFoundError:
        return False
    found = DataManifest.from_json(text)
    if found.version != version:
        raise DataError(f"{manifest_name}: holds data version {found.version}; expected {version}")
    return True


def _wait_for_copy(
    target: BlobClient, entry: DataFile, sleep: Callable[[float], None], clock: Callable[[], float]
) -> None:
    """Most same-account copies finish at once; a pending one is polled until it ends or times out."""
    deadline = clock() + COPY_TIMEOUT_S
    delay = _COPY_POLL_FIRST_S
    while True:
        copy = target.get_blob_properties().copy
        if copy.status == "success":
            return
        if copy.status in ("failed", "aborted"):
            raise DataError(
                f"{entry.source}: copy into the snapshot {copy.status} ({copy.status_description})"
            )
        if clock() >= deadline:
            target.abort_copy(copy.id)
            raise DataError(
                f"{entry.source}: copy into the snapshot pending after {COPY_TIMEOUT_S:.0f} s; try again"
            )
        sleep(delay)
        delay = min(delay * 2, _COPY_POLL_MAX_S)


def _copy_one(
    container_client: ContainerClient,
    entry: DataFile,
    target_name: str,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> None:
    from azure.core import MatchConditions
    from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

    target = container_client.get_blob_client(target_name)
    try:
        result = target.start_copy_from_url(
            entry.source, source_etag=_etag_of(entry), source_match_condition=MatchConditions.IfNotModified
        )
    except ResourceModifiedError:
        raise DataError(
            f"{entry.source}: changed while the data was being snapshotted (eTag no longer "
            f"{entry.fingerprint.removeprefix(ETAG_PREFIX)}); snapshot again once the upload is complete"
        ) from None
    except ResourceNotFoundError:
        raise DataError(
            f"{entry.source}: deleted while the data was being snapshotted; snapshot the prefix again"
        ) from None
    if result.get("copy_status") != "success":
        _wait_for_copy(target, entry, sleep, clock)


def copy_snapshot(
    container_client: ContainerClient,
    manifest: DataManifest,
    snapshots_prefix: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Copy the blobs `manifest` lists into `<snapshots_prefix>/<version>/`, each only if its eTag is still
    the listed one, then write the manifest; returns the snapshot prefix. Reuses a complete snapshot."""
    folder, manifest_name = snapshot_paths(snapshots_prefix, manifest.version)
    if _existing_snapshot(container_client, manifest_name, manifest.version):
        log.info("data version %s: reusing the complete snapshot %s", manifest.version, folder)
        return folder
    for entry in manifest.files:
        _copy_one(container_client, entry, f"{folder}{entry.name}", sleep, clock)
    from azure.storage.blob import ContentSettings

    container_client.get_blob_client(manifest_name).upload_blob(
        manifest.to_json().encode(),
        overwrite=True,
        content_settings=ContentSettings(content_type="application/json"),
    )
    log.info("data version %s: snapshot of %d files at %s", manifest.version, len(manifest.files), folder)
    return folder


def snapshot_blob_prefix(
    container_client: ContainerClient,
    prefix: str,
    snapshots_prefix: str,
    suffixes: tuple[str, ...] = RAW_SUFFIXES,
    depth: int = 1,
) -> tuple[DataManifest, str]:
    """Pin the raw blobs under `prefix` as an immutable snapshot; returns (manifest, snapshot prefix)."""
    manifest = manifest_of_blob_prefix(container_client, prefix, suffixes, depth)
    return manifest, copy_snapshot(container_client, manifest, snapshots_prefix)


def split_folder_url(url: str) -> tuple[str, str]:
    """(container URL, folder prefix) of a blob folder URL such as
    https://<account>.blob.core.windows.net/<container>/<prefix>/ (or an emulator's path-style URL)."""
    from azure.storage.blob import BlobClient

    try:
        blob = BlobClient.from_blob_url(url)
    except ValueError:
        raise DataError(
            f"--data {mask_secrets(url)}: expected a blob folder URL "
            "https://<account>.blob.core.windows.net/<container>/<prefix>/"
        ) from None
    return f"{blob.scheme}://{blob.primary_hostname}/{blob.container_name}", folder_prefix(blob.blob_name)
