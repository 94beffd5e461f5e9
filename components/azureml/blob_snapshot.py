"""Data versions from Blob Storage: a manifest of blob eTags, and an immutable snapshot of it that copies
only what no earlier version stored.

A blob's eTag changes whenever its content does, so the manifest of a prefix (every raw blob's name, size
and eTag) identifies the data exactly, and its content hash is the data version (components/data_version).
A snapshot keeps each blob's bytes once, in the model's object store `<snapshots>/store/objects/<key>`
(core/pinned_store.py: the key is the blob's Content-MD5 and size when Storage has it, else its name and
eTag), so a new version copies, server-side, only the blobs whose bytes the store lacks, and is otherwise
its manifest: `<snapshots>/store/<version>.manifest.json`, each file's object named in it. A copy is made on
the condition that the source still carries the listed eTag: a blob replaced mid-snapshot fails the
snapshot instead of mixing two versions of the data. The manifest is written last; its presence marks the
snapshot complete, so a repeated snapshot of the same data reuses it. A version pinned before the store
existed (a full copy in `<snapshots>/<version>/`, its manifest beside it) is reused as it is.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from components.data_version import (
    RAW_SUFFIXES,
    DataError,
    DataFile,
    DataManifest,
    is_raw_name,
)
from core.blob_urls import require_name_in_container
from core.pinned_store import (
    LATEST_NAME,
    OBJECTS_FIELD,
    OBJECTS_FOLDER,
    STORE_FOLDER,
    etag_key,
    key_size,
    manifest_name,
    md5_key,
    version_document,
)
from core.secrets import mask_secrets
from core.versions import MANIFEST_SUFFIX

if TYPE_CHECKING:
    from azure.storage.blob import BlobClient, BlobProperties, ContainerClient

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


@dataclass(frozen=True)
class BlobSnapshot:
    """Where a pinned data version lies in its container: `folder`, the prefix a job reads (the model's
    store, or an older pin's own copy), and `manifest_name`, the blob whose presence marks it complete.
    `copied` names the objects this pin copied: the bytes no earlier version had stored. `folder_bytes` is
    what the folder holds, so what a job that downloads it fetches (the whole store: every version's
    objects), which is what chooses its input mode (components/azureml/input_modes.py)."""

    folder: str
    manifest_name: str
    copied: tuple[str, ...] = ()
    folder_bytes: int | None = None


def _root(snapshots_prefix: str) -> str:
    root = folder_prefix(snapshots_prefix)
    if not root:
        raise DataError("snapshots prefix is empty; expected a folder such as 'retrain/snapshots/digits'")
    return root


def snapshot_paths(snapshots_prefix: str, version: str) -> tuple[str, str]:
    """(the folder prefix, the manifest blob name) of a version pinned as a full copy, before the store."""
    root = _root(snapshots_prefix)
    return f"{root}{version}/", f"{root}{version}{MANIFEST_SUFFIX}"


def store_folder(snapshots_prefix: str) -> str:
    """The prefix of the model's store: `<snapshots>/store/`."""
    return f"{_root(snapshots_prefix)}{STORE_FOLDER}/"


def store_paths(snapshots_prefix: str, version: str) -> tuple[str, str]:
    """(the store's folder prefix, the version's manifest blob name in it) for a data version."""
    store = store_folder(snapshots_prefix)
    return store, f"{store}{manifest_name(version)}"


def _etag_of(entry: DataFile) -> str:
    if not entry.fingerprint.startswith(ETAG_PREFIX):
        raise DataError(
            f"{entry.name}: fingerprint {entry.fingerprint!r}; a blob snapshot needs 'etag:<etag>' ones"
        )
    return f'"{entry.fingerprint.removeprefix(ETAG_PREFIX)}"'


def _manifest_text(container_client: ContainerClient, manifest_blob: str, version: str) -> str | None:
    """The manifest blob's text if there is one, which must be of `version`; None if there is none."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        text = container_client.get_blob_client(manifest_blob).download_blob(encoding="utf-8").readall()
    except ResourceNotFoundError:
        return None
    found = DataManifest.from_json(text)
    if found.version != version:
        raise DataError(f"{manifest_blob}: holds data version {found.version}; expected {version}")
    return text


def _pinned_objects(
    container_client: ContainerClient, manifest_blob: str, version: str
) -> dict[str, str] | None:
    """The object of each file of a store's complete version; None when there is none (a manifest that
    names no object for some file is not one: this pin writes it again)."""
    text = _manifest_text(container_client, manifest_blob, version)
    if text is None:
        return None
    objects = json.loads(text).get(OBJECTS_FIELD)
    files = DataManifest.from_json(text).files
    if not isinstance(objects, dict) or any(file.name not in objects for file in files):
        return None
    return {str(name): str(key) for name, key in objects.items()}


def _source_name(container_client: ContainerClient, entry: DataFile) -> str:
    """The name in this container of a manifest's blob (its source is the blob's URL)."""
    expected = "the blobs of the container the snapshot is kept in"
    return require_name_in_container(entry.source, container_client.container_name, DataError, expected)


def _listed_sources(
    container_client: ContainerClient, names: Mapping[str, DataFile]
) -> dict[str, BlobProperties]:
    """The source blobs as they are now, with their Content-MD5: one listing of the narrowest folder holding
    them all, not a request per blob."""
    common = posixpath.commonpath([posixpath.dirname(name) for name in names])
    folder = f"{common}/" if common else ""
    return {
        blob.name: blob for blob in container_client.list_blobs(name_starts_with=folder) if blob.name in names
    }


def _object_key(entry: DataFile, name: str, now: BlobProperties | None) -> str:
    """The key of `entry`'s bytes, from the listing: the source must still be the listed state."""
    listed = entry.fingerprint.removeprefix(ETAG_PREFIX)
    if now is None:
        raise DataError(
            f"{entry.source}: deleted while the data was being snapshotted; snapshot the prefix again"
        )
    if str(now.etag).strip('"') != listed:
        raise DataError(
            f"{entry.source}: changed while the data was being snapshotted (eTag no longer {listed}); "
            "snapshot again once the upload is complete"
        )
    md5 = now.content_settings.content_md5 if now.content_settings else None
    return md5_key(md5, entry.size) if md5 else etag_key(name, listed, entry.size)


def _stored_objects(container_client: ContainerClient, objects: str) -> dict[str, BlobProperties]:
    """The store's objects, by key: one listing."""
    return {
        blob.name[len(objects) :]: blob
        for blob in container_client.list_blobs(name_starts_with=objects, include=["copy"])
    }


def _wait_for_copy(
    target: BlobClient, entry: DataFile, sleep: Callable[[float], None], clock: Callable[[], float]
) -> None:
    """Most same-account copies finish at once; a pending one is polled until it ends or times out."""
    deadline = clock() + COPY_TIMEOUT_S
    delay = _COPY_POLL_FIRST_S
    while True:
        copy = target.get_blob_properties().copy
        if copy.status in (None, "success"):
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


def _whole(stored: BlobProperties | None, key: str) -> bool:
    """Whether a listed object is all there: the size its key says, and no copy into it pending or failed."""
    status = stored.copy.status if stored is not None and stored.copy else None
    return stored is not None and stored.size == key_size(key) and status in (None, "success")


def _holds(
    container_client: ContainerClient,
    stored: BlobProperties | None,
    key: str,
    entry: DataFile,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> bool:
    """Whether the store already holds the object `key` whole (`_whole`; a stray write of another size is
    copied over, and so is a failed copy); a copy another pin left pending is waited for."""
    if (
        stored is not None
        and stored.size == key_size(key)
        and stored.copy
        and stored.copy.status == "pending"
    ):
        _wait_for_copy(container_client.get_blob_client(stored.name), entry, sleep, clock)
        return True
    return _whole(stored, key)


def _upload(container_client: ContainerClient, name: str, text: str, content_type: str) -> None:
    from azure.storage.blob import ContentSettings

    container_client.get_blob_client(name).upload_blob(
        text.encode(), overwrite=True, content_settings=ContentSettings(content_type=content_type)
    )


def copy_snapshot(
    container_client: ContainerClient,
    manifest: DataManifest,
    snapshots_prefix: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> BlobSnapshot:
    """Pin the blobs `manifest` lists as a version of the store under `snapshots_prefix`: copy into the store
    each blob whose bytes it lacks, only if its eTag is still the listed one, then write the manifest with
    each file's object. Reuses a complete snapshot (the store's, or a full copy made before it)."""
    store, store_manifest = store_paths(snapshots_prefix, manifest.version)
    objects = f"{store}{OBJECTS_FOLDER}/"
    pinned = _pinned_objects(container_client, store_manifest, manifest.version)
    if pinned is None:
        copy_folder, copy_manifest = snapshot_paths(snapshots_prefix, manifest.version)
        if _manifest_text(container_client, copy_manifest, manifest.version) is not None:
            log.info("data version %s: reusing the complete snapshot %s", manifest.version, copy_folder)
            return BlobSnapshot(copy_folder, copy_manifest, folder_bytes=manifest.total_bytes)
    stored = _stored_objects(container_client, objects)
    if pinned is not None:
        lost = sorted(name for name, key in pinned.items() if not _whole(stored.get(key), key))
        if not lost:
            log.info("data version %s: reusing the complete snapshot %s", manifest.version, store_manifest)
            return BlobSnapshot(store, store_manifest, folder_bytes=_bytes_of(stored))
        log.warning("data version %s in %s: the objects of %d file(s) are gone (%s first); pinning it again",
                    manifest.version, store, len(lost), lost[0])  # fmt: skip
    names = {_source_name(container_client, entry): entry for entry in manifest.files}
    sources = _listed_sources(container_client, names)
    keys: dict[str, str] = {}
    copied: list[str] = []
    for name, entry in names.items():
        key = keys[entry.name] = _object_key(entry, name, sources.get(name))
        if key in copied or _holds(container_client, stored.get(key), key, entry, sleep, clock):
            continue  # bytes an earlier version (or another file of this one) stored: nothing to copy
        _copy_one(container_client, entry, f"{objects}{key}", sleep, clock)
        copied.append(key)
    document = version_document(manifest.to_json(), keys, now())
    _upload(container_client, store_manifest, document, "application/json")
    # Last: a job whose data asset is `<model>-raw@latest` reads the version pinned last (its asset is
    # registered after this pin), and a version is named here only once it is complete.
    _upload(container_client, f"{store}{LATEST_NAME}", f"{manifest.version}\n", "text/plain")
    log.info(
        "data version %s: %d files in %s, %d of them copied (%d bytes)",
        manifest.version, len(names), store, len(copied),
        sum(entry.size for entry in manifest.files if keys[entry.name] in copied),
    )  # fmt: skip
    new = {keys[entry.name]: entry.size for entry in manifest.files if keys[entry.name] not in stored}
    return BlobSnapshot(store, store_manifest, tuple(copied), _bytes_of(stored) + sum(new.values()))


def _bytes_of(stored: dict[str, BlobProperties]) -> int:
    return sum(int(properties.size or 0) for properties in stored.values())


def snapshot_blob_prefix(
    container_client: ContainerClient,
    prefix: str,
    snapshots_prefix: str,
    suffixes: tuple[str, ...] = RAW_SUFFIXES,
    depth: int = 1,
) -> tuple[DataManifest, BlobSnapshot]:
    """Pin the raw blobs under `prefix` as an immutable snapshot; returns (manifest, where it lies)."""
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
