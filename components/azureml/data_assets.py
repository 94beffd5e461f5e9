"""A pinned data version as an Azure ML data asset: `<model>-raw`, version = the data version.

The asset points at the immutable snapshot written by components/blob_snapshot.py in a datastore's
container, so `azureml:<model>-raw:<data version>` always names the same files. Registering is idempotent:
an asset version that already exists at the same path is reused; one at another path is an error, because
a data version must never name two different snapshots.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from components.data_version import MANIFEST_SUFFIX, DataManifest
from components.errors import SubmissionError

if TYPE_CHECKING:
    from azure.ai.ml.entities import Data

    from components.azureml.workspace import AssetRecord, AzureMLWorkspace

log = logging.getLogger(__name__)


def data_asset_name(model_name: str) -> str:
    return f"{model_name}-raw"


def data_asset_reference(model_name: str, version: str) -> str:
    return f"azureml:{data_asset_name(model_name)}:{version}"


def datastore_path(datastore: str, snapshot_prefix: str) -> str:
    return f"azureml://datastores/{datastore}/paths/{snapshot_prefix.strip('/')}/"


def _datastore_relative(path: str) -> str:
    """'datastores/<name>/paths/<path>' of a short or a long (subscription-qualified) datastore URI."""
    start = path.find("datastores/")
    return (path[start:] if start >= 0 else path).rstrip("/")


def build_data_asset(model_name: str, manifest: DataManifest, datastore: str, snapshot_prefix: str) -> Data:
    """The uri_folder data asset for a snapshot; tags carry the file count, size and manifest location."""
    from azure.ai.ml.entities import Data

    folder = snapshot_prefix.strip("/")
    return Data(
        name=data_asset_name(model_name),
        version=manifest.version,
        type="uri_folder",
        path=datastore_path(datastore, folder),
        description=f"Raw data for {model_name}: {len(manifest.files)} files pinned by their eTags",
        tags={
            "retrain.data_version": manifest.version,
            "retrain.file_count": str(len(manifest.files)),
            "retrain.total_bytes": str(manifest.total_bytes),
            "retrain.manifest": f"{folder}{MANIFEST_SUFFIX}",
        },
    )


def register_data_asset(workspace: AzureMLWorkspace, data: Data) -> AssetRecord:
    """Create the asset version, or reuse it when it already points at the same snapshot."""
    name, version = str(data.name), str(data.version)
    existing = workspace.get_data(name, version)
    if existing is not None:
        if existing.path and _datastore_relative(existing.path) != _datastore_relative(str(data.path)):
            raise SubmissionError(
                f"data asset {name}:{version} already points at {existing.path}, not {data.path}; "
                "a data version must name one snapshot"
            )
        log.info("data asset %s:%s already registered", name, version)
        return existing
    return workspace.create_data(data)
