"""The Function App's Azure ML pin (function_app/pinning.py RegisteredSnapshot): the data is kept in the
model's object store inside the landing container and registered through the data datastore, which must be
on that container. Real Azurite containers; only the workspace is the recording fake."""

from __future__ import annotations

import hashlib

import pytest
from helpers.components.azure_fakes import RecordingWorkspace

from components.azureml.workspace import DatastoreRecord
from function_app.pinning import PinError, RegisteredSnapshot, listed_manifest
from function_app.settings.app import AppSettings
from function_app.wiring import _submitter_and_pinner

CSV = b"id,x,label\n1,0.5,a\n2,0.25,b\n"


@pytest.fixture
def landing(blob_container):
    for name in ("a.csv", "b.csv"):
        blob_container.get_blob_client(f"raw/digits/{name}").upload_blob(CSV)
    return blob_container


@pytest.fixture
def checkpoints(azurite):
    container = azurite.new_container()
    yield container
    container.delete_container()


def _workspace(azurite, landing, checkpoints) -> RecordingWorkspace:
    """The deployment's two datastores: retrain_landing (its account as typed, in capitals: storage account
    names are DNS labels, equal without case) and retrain_checkpoints."""
    workspace = RecordingWorkspace()
    for name, container in (("retrain_landing", landing), ("retrain_checkpoints", checkpoints)):
        account = container.account_name.upper() if container is landing else container.account_name
        workspace.datastores[name] = DatastoreRecord(
            name, account, container.container_name, blob_endpoint=azurite.blob_endpoint
        )
    return workspace


def test_a_pin_is_registered_through_the_data_datastore_on_the_landing_container(
    azurite, landing, checkpoints
):
    workspace = _workspace(azurite, landing, checkpoints)
    pinner = RegisteredSnapshot(landing, workspace, "retrain_landing")
    manifest = listed_manifest(landing, f"{landing.url}/raw/digits", (".csv",))

    ref = pinner.pin(manifest, "digits")

    store = "retrain/snapshots/digits/store/"
    # The size is what a download of the store fetches: its objects, here one for both files.
    assert (ref.uri, ref.size_bytes) == (f"azureml:digits-raw:{manifest.version}", len(CSV))
    (data,) = workspace.sent
    assert data.path == f"azureml://datastores/retrain_landing/paths/{store}"
    assert data.tags["retrain.manifest"] == f"{store}{manifest.version}.manifest.json"
    # a.csv and b.csv hold the same bytes, which Storage's Content-MD5 says: one object serves both.
    assert {blob.name.removeprefix(store) for blob in landing.list_blobs(name_starts_with=store)} == {
        f"{manifest.version}.manifest.json",
        "latest",
        f"objects/md5-{hashlib.md5(CSV).hexdigest()}-{len(CSV)}",
    }
    assert not list(checkpoints.list_blobs())


def test_a_data_datastore_on_another_container_pins_nothing(azurite, landing, checkpoints):
    workspace = _workspace(azurite, landing, checkpoints)
    pinner = RegisteredSnapshot(landing, workspace, "retrain_checkpoints")
    manifest = listed_manifest(landing, f"{landing.url}/raw/digits", (".csv",))
    here = f"{landing.account_name}/{landing.container_name}"

    with pytest.raises(PinError) as raised:
        pinner.pin(manifest, "digits")

    assert str(raised.value) == (
        f"RETRAIN_AZUREML_DATA_DATASTORE retrain_checkpoints is on container {checkpoints.account_name}/"
        f"{checkpoints.container_name}, not the data's {here}, so a snapshot registered through it would "
        "point at nothing; expected RETRAIN_AZUREML_DATA_DATASTORE to name a blob datastore on "
        f"{here} (create one with `az ml datastore create`)"
    )
    assert sorted(blob.name for blob in landing.list_blobs()) == ["raw/digits/a.csv", "raw/digits/b.csv"]
    assert not list(checkpoints.list_blobs())
    assert workspace.calls == [("get_datastore", "retrain_checkpoints")]  # nothing registered


def test_an_unknown_data_datastore_pins_nothing(azurite, landing, checkpoints):
    workspace = _workspace(azurite, landing, checkpoints)
    manifest = listed_manifest(landing, f"{landing.url}/raw/digits", (".csv",))

    with pytest.raises(
        PinError, match=r"^RETRAIN_AZUREML_DATA_DATASTORE lake: not in the workspace; expected"
    ):
        RegisteredSnapshot(landing, workspace, "lake").pin(manifest, "digits")
    assert not list(landing.list_blobs(name_starts_with="retrain/"))
    assert workspace.called("create_data") == []


def test_the_app_pins_through_the_data_datastore_and_submits_with_the_pipelines():
    settings = AppSettings.from_environ(
        {
            "RETRAIN_SUBMITTER": "azureml",
            "RETRAIN_BLOB_ACCOUNT": "stexample",
            "RETRAIN_BLOB_CONTAINER": "landing",
            "RETRAIN_AZUREML_DATASTORE": "retrain_checkpoints",
            "RETRAIN_AZUREML_DATA_DATASTORE": "retrain_landing",
        }
    )
    workspace = {
        "AZURE_SUBSCRIPTION_ID": "sub-1",
        "AZURE_RESOURCE_GROUP": "rg-1",
        "AZUREML_WORKSPACE": "ws-1",
    }

    submitter, pinners = _submitter_and_pinner(settings, workspace, None)  # connects to nothing yet

    assert submitter.settings.datastore == "retrain_checkpoints"
    assert pinners.pinner("digits").datastore == "retrain_landing"
