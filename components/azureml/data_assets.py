"""A pinned data version as an Azure ML data asset: `<model>-raw`, version = the data version.

The asset points at the snapshot written by components/azureml/blob_snapshot.py in a datastore's container:
the model's object store, where the version is its manifest (the prep step reads it by the pipeline's
`raw_data_version`, core/pinned_store.py), or a version's own full copy pinned before the store existed.
Either way `azureml:<model>-raw:<data version>` always names the same files. Registering is idempotent:
an asset version that already exists at the same path is reused; one at another path is an error, because
a data version must never name two different snapshots.

The snapshot is copied inside the landing container (a server-side copy, beside the data), and the asset's
path is relative to a datastore: so the data datastore (RETRAIN_AZUREML_DATA_DATASTORE, `--data-datastore`)
must be a datastore on that very container, or the asset points at nothing. It is not the pipeline's
datastore (RETRAIN_AZUREML_DATASTORE: checkpoints and the registry lock), whose container the compute writes
and Event Grid does not watch; with one container for everything the two are the same, hence the default.
`check_data_datastore` is the one check of that, run before anything is copied.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from components.data_version import DataManifest
from components.errors import SubmissionError
from core.versions import MANIFEST_SUFFIX

if TYPE_CHECKING:
    from azure.ai.ml.entities import Data
    from azure.storage.blob import ContainerClient

    from components.azureml.workspace import AssetRecord, AzureMLWorkspace, DatastoreRecord

log = logging.getLogger(__name__)

# The datastore on the landing container, where pinned snapshots are registered; unset: the pipeline's.
DATA_DATASTORE_SETTING = "RETRAIN_AZUREML_DATA_DATASTORE"


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


def check_data_datastore(
    workspace: AzureMLWorkspace, name: str, container: ContainerClient, where: str, fix: str | None = None
) -> DatastoreRecord:
    """Datastore `name` if its container is `container`, the one a snapshot is copied into; otherwise a
    one-line SubmissionError naming `where` the name came from and `fix`, the flag or setting that names
    another (default: `where`). Storage account names are DNS labels, compared without case (a datastore
    may spell one as it was typed); container names are exact."""
    here = f"{container.account_name}/{container.container_name}"
    fix = fix or where
    datastore = workspace.get_datastore(name)
    if datastore is None:
        raise SubmissionError(
            f"{where} {name}: not in the workspace; expected {fix} to name a blob datastore on the data's "
            f"container {here} (create one with `az ml datastore create`)"
        )
    account, container_name = datastore.account_name or "?", datastore.container_name or "?"
    if (account.lower(), container_name) != (str(container.account_name).lower(), container.container_name):
        raise SubmissionError(
            f"{where} {name} is on container {account}/{container_name}, not the data's {here}, "
            f"so a snapshot registered through it would point at nothing; expected {fix} to name a blob "
            f"datastore on {here} (create one with `az ml datastore create`)"
        )
    return datastore


def build_data_asset(
    model_name: str,
    manifest: DataManifest,
    datastore: str,
    snapshot_prefix: str,
    manifest_blob: str | None = None,
) -> Data:
    """The uri_folder data asset for a snapshot; tags carry the file count, size and manifest location
    (`manifest_blob`; unset, the full copy's, beside its folder)."""
    from azure.ai.ml.entities import Data

    folder = snapshot_prefix.strip("/")
    return Data(
        name=data_asset_name(model_name),
        version=manifest.version,
        type="uri_folder",
        path=datastore_path(datastore, folder),
        description=f"Raw data for {model_name}: {len(manifest.files)} files pinned by their eTags",
        tags={
            "retrain.raw_version": manifest.version,
            "retrain.file_count": str(len(manifest.files)),
            "retrain.total_bytes": str(manifest.total_bytes),
            "retrain.manifest": manifest_blob or f"{folder}{MANIFEST_SUFFIX}",
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
