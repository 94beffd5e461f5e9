"""The registry lock an Azure ML pipeline hands its register step: a blob in the pipeline's datastore.

The register step moves the `champion` alias by compare-and-set under a lock (training/gate/lock.py). Its
default, a lock folder on the step's own node, serialises nothing between two jobs on two nodes (a forced
HTTP run and a drift run of one model), so every Azure ML build passes a blob lease instead:
`<the datastore's container URL>/retrain/locks`, one lock blob per model (`<model>.lock`). The datastore is
the one the pipeline already keeps its checkpoints in, in the storage the deployment creates, where the
compute identity may write. A run's `registry_lock` parameter, when given, is used instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.azureml.builder import DATASTORE_SETTING
from components.azureml.workspace import AzureMLWorkspace, DatastoreRecord
from components.errors import SubmissionError
from components.parameters import REGISTRY_LOCK_INPUT, check_registry_lock

LOCKS_PREFIX = "retrain/locks"
_EXPLICIT = f"--param {REGISTRY_LOCK_INPUT}=https://<account>.blob.core.windows.net/<container>/<prefix>"


def registry_lock_url(datastore: DatastoreRecord) -> str:
    """`<container URL>/retrain/locks` of a blob datastore; a one-line error for any other kind."""
    container = datastore.container_url
    if container is None:
        raise SubmissionError(
            f"datastore {datastore.name}: a {datastore.kind or 'typeless'} datastore, where the register "
            "step's lock (a blob lease) cannot live; expected an Azure Blob datastore (type azure_blob) in "
            f"--datastore or {DATASTORE_SETTING}, or the lock itself as {_EXPLICIT}"
        )
    return check_registry_lock(f"{container}/{LOCKS_PREFIX}", f"datastore {datastore.name}'s registry lock")


def resolve_registry_lock(
    workspace: AzureMLWorkspace, datastore: str, parameters: Mapping[str, Any]
) -> str | None:
    """The lock URL a build passes: None when the run's parameters set `registry_lock` themselves (the
    datastore is then not read); otherwise the lock in `datastore`'s container."""
    if parameters.get(REGISTRY_LOCK_INPUT):
        return None
    record = workspace.get_datastore(datastore)
    if record is None:
        raise SubmissionError(
            f"datastore {datastore}: not in the workspace; expected the name of a blob datastore in "
            f"--datastore or {DATASTORE_SETTING}"
        )
    return registry_lock_url(record)
