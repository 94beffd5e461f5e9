"""Pin a batch's data: the blobs it brings plus what earlier runs trained on, as one content-hashed manifest.

A submission trains on every blob that has landed so far (the latest version of each name), not just the
burst that triggered it; the new blobs are its `inputs`. The manifest lists each blob with its eTag, so the
data version changes exactly when some blob does. Where the submitter runs decides what a pin becomes: a
downloaded folder (local), a server-side snapshot registered as a data asset (Azure ML), or only the
snapshot's planned path (dry run). Every copy is conditioned on the listed eTag: a blob replaced meanwhile
fails the pin instead of mixing versions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote

from components.data_version import MANIFEST_SUFFIX, DataFile, DataManifest
from components.request import DataRef
from function_app.policy import PendingBlob

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

SNAPSHOTS_ROOT = "retrain/snapshots"


def batch_manifest(blobs: Iterable[PendingBlob], previous: DataManifest | None) -> DataManifest:
    """`previous`'s files, with the batch's blobs added or replacing the same names. A blob's name is its
    file name: the parser accepts only blobs directly under the landing prefix."""
    files = {file.name: file for file in (previous.files if previous else ())}
    for blob in blobs:
        name = blob.url.rsplit("/", 1)[-1]
        files[name] = DataFile(name, blob.size, f"etag:{blob.etag}", blob.url)
    return DataManifest(tuple(files.values()))


class DataPinner(Protocol):
    def pin(self, manifest: DataManifest, model_name: str) -> DataRef: ...


class PlannedSnapshot:
    """Dry run: where the snapshot would be, without copying anything."""

    def __init__(self, datastore: str = "workspaceblobstore") -> None:
        self._datastore = datastore

    def pin(self, manifest: DataManifest, model_name: str) -> DataRef:
        path = f"{SNAPSHOTS_ROOT}/{model_name}/{manifest.version}/"
        return DataRef(manifest.version, f"azureml://datastores/{self._datastore}/paths/{path}")


class DownloadedFolder:
    """Local runs: the pinned blobs downloaded, each only at its listed eTag, into an immutable folder."""

    def __init__(self, container: ContainerClient, state_root: Path) -> None:
        self._container = container
        self._root = state_root / "data"

    def pin(self, manifest: DataManifest, model_name: str) -> DataRef:
        from azure.core import MatchConditions

        target = self._root / model_name / manifest.version
        if (self._root / model_name / f"{manifest.version}{MANIFEST_SUFFIX}").exists():
            return DataRef(manifest.version, str(target))
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{manifest.version}.", dir=target.parent))
        try:
            for file in manifest.files:
                name = file.source.split(f"/{self._container.container_name}/", 1)[1]
                blob = self._container.get_blob_client(unquote(name))
                etag = file.fingerprint.removeprefix("etag:")
                data = blob.download_blob(etag=etag, match_condition=MatchConditions.IfNotModified).readall()
                (staging / file.name).write_bytes(data)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        (self._root / model_name / f"{manifest.version}{MANIFEST_SUFFIX}").write_text(manifest.to_json())
        return DataRef(manifest.version, str(target))


class RegisteredSnapshot:
    """Azure ML: a server-side snapshot of the pinned blobs, registered as a data asset version."""

    def __init__(self, container: ContainerClient, workspace: object, datastore: str) -> None:
        self._container = container
        self._workspace = workspace
        self._datastore = datastore

    def pin(self, manifest: DataManifest, model_name: str) -> DataRef:
        from components.azureml.data_assets import build_data_asset, data_asset_reference, register_data_asset
        from components.blob_snapshot import copy_snapshot

        prefix = copy_snapshot(self._container, manifest, f"{SNAPSHOTS_ROOT}/{model_name}")
        register_data_asset(self._workspace, build_data_asset(model_name, manifest, self._datastore, prefix))
        return DataRef(manifest.version, data_asset_reference(model_name, manifest.version))
