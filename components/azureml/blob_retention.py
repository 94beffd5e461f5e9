"""Retention of a model's pinned data versions in Blob Storage, and collection of the objects none of them
names: components/local/retention.py's rules, for the store components/azureml/blob_snapshot.py writes.

A version stays when it is among the model's `keep` newest (by when its manifest was written, which it says
to the microsecond: its first pin, since a reused pin writes nothing), when the caller names it as in use
(an unfinished submission, the last finished one, a registered model's lineage), or when the store's
`latest` names it (a scheduled job whose data asset is `<model>-raw@latest` reads that one). A version goes
by its manifest alone, removed first, so that what a removal cut short leaves is an incomplete pin, never a
version that says it is whole and is not; a version pinned as a full copy before the store existed goes
with its folder.

Then every object no remaining manifest names is removed, once it is older than `grace`: a pin copies its
objects before it writes its manifest, so a young object no manifest names yet may be a pin's in progress.
There is no lock between a pin and a collection: a pin that takes up an old unnamed object (bytes an earlier
version held) at the very moment it is collected writes a version missing that object, which its next pin
finds and copies again, and which the prep step refuses in one line meanwhile (core/pinned_store.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from components.azureml.blob_snapshot import folder_prefix, store_folder
from components.errors import PipelineError
from core.pinned_store import LATEST_NAME, OBJECTS_FIELD, OBJECTS_FOLDER, PINNED_AT_FIELD
from core.versions import MANIFEST_SUFFIX, is_raw_version

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

log = logging.getLogger(__name__)

DEFAULT_GRACE = timedelta(days=1)  # far longer than a pin takes between its first copy and its manifest


@dataclass(frozen=True)
class BlobVersion:
    version: str
    manifest_name: str
    pinned_at: datetime
    folder: str | None = None  # a full copy's own folder; None for a version of the store

    def describe(self) -> str:
        return f"{self.version} (pinned {self.pinned_at.isoformat(timespec='seconds')})"


@dataclass(frozen=True)
class BlobCollection:
    """What one collection did: the versions removed, those kept and why, and the objects' count and bytes."""

    removed: tuple[BlobVersion, ...]
    kept: tuple[tuple[BlobVersion, str], ...]
    objects: int
    bytes: int


def _pinned_at(container: ContainerClient, name: str, modified: datetime, in_store: bool) -> datetime:
    """When a version was pinned: a store's manifest says, to the microsecond; a full copy's listing does."""
    if not in_store:
        return modified
    text = container.get_blob_client(name).download_blob(encoding="utf-8").readall()
    try:
        return datetime.fromisoformat(str(json.loads(text)[PINNED_AT_FIELD]))
    except (ValueError, KeyError, TypeError):
        return modified


def _versions(container: ContainerClient, snapshots_prefix: str) -> list[BlobVersion]:
    """The complete versions under `snapshots_prefix`, newest first: the store's, and full copies'."""
    root, store = folder_prefix(snapshots_prefix), store_folder(snapshots_prefix)
    found = []
    for place in (store, root):  # one listing level each: never the objects, nor a full copy's files
        for item in container.walk_blobs(name_starts_with=place, delimiter="/"):
            name = item.name[len(place) :]
            version = name.removesuffix(MANIFEST_SUFFIX)
            if name.endswith(MANIFEST_SUFFIX) and is_raw_version(version):
                pinned_at = _pinned_at(container, item.name, item.last_modified, place == store)
                folder = None if place == store else f"{root}{version}/"
                found.append(BlobVersion(version, item.name, pinned_at, folder))
    return sorted(found, key=lambda pinned: (pinned.pinned_at, pinned.version), reverse=True)


def _latest(container: ContainerClient, store: str) -> str | None:
    from azure.core.exceptions import ResourceNotFoundError

    try:
        return (
            container.get_blob_client(f"{store}{LATEST_NAME}")
            .download_blob(encoding="ascii")
            .readall()
            .strip()
        )
    except ResourceNotFoundError:
        return None


def _named_objects(container: ContainerClient, pinned: BlobVersion) -> set[str]:
    text = container.get_blob_client(pinned.manifest_name).download_blob(encoding="utf-8").readall()
    objects = json.loads(text).get(OBJECTS_FIELD)
    return set(objects.values()) if isinstance(objects, dict) else set()


def _remove(container: ContainerClient, pinned: BlobVersion) -> None:
    log.info("removing pinned data version %s", pinned.describe())
    container.delete_blob(pinned.manifest_name)  # first: what is left is an incomplete pin
    if pinned.folder is not None:
        for blob in container.list_blobs(name_starts_with=pinned.folder):
            container.delete_blob(blob.name)


def collect_blob_store(
    container: ContainerClient,
    snapshots_prefix: str,
    in_use: Mapping[str, str],
    keep: int = 3,
    *,
    grace: timedelta = DEFAULT_GRACE,
    now: datetime | None = None,
    dry_run: bool = False,
) -> BlobCollection:
    """Remove the versions under `snapshots_prefix` that are neither among its `keep` newest, nor named in
    `in_use` (version -> why), nor the store's latest; then the objects older than `grace` that no remaining
    version names. With `dry_run`, only say which."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise PipelineError(
            f"--keep {keep!r}: expected a whole number of at least 1 (the newest pin is what the next run "
            "builds on)"
        )
    store = store_folder(snapshots_prefix)
    latest = _latest(container, store)
    removed, kept = [], []
    for rank, pinned in enumerate(_versions(container, snapshots_prefix), start=1):
        why = in_use.get(pinned.version)
        if why is None and pinned.version == latest:
            why = "the store's latest (what a scheduled job reads)"
        if why is None and rank <= keep:
            why = f"among the {keep} newest pins"
        if why is not None:
            kept.append((pinned, why))
            continue
        removed.append(pinned)
        if not dry_run:
            _remove(container, pinned)
    named = set().union(*(_named_objects(container, pinned) for pinned, _ in kept if pinned.folder is None))
    objects = f"{store}{OBJECTS_FOLDER}/"
    before = (now or datetime.now(UTC)) - grace
    count = freed = 0
    for blob in container.list_blobs(name_starts_with=objects):
        if blob.name[len(objects) :] in named or blob.last_modified > before:
            continue
        count, freed = count + 1, freed + blob.size
        if not dry_run:
            container.delete_blob(blob.name)
    return BlobCollection(tuple(removed), tuple(kept), count, freed)
