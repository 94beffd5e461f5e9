"""A pinned data version as an Azure ML data asset, registered once through the seam."""

from __future__ import annotations

import pytest
from helpers.components.azure_fakes import RecordingWorkspace

from components.azureml.data_assets import build_data_asset, data_asset_reference, register_data_asset
from components.azureml.workspace import AssetRecord
from components.data_version import DataFile, DataManifest
from components.errors import SubmissionError

MANIFEST = DataManifest(
    (
        DataFile("a.csv", 10, "etag:0x8DC1", "https://acct.blob.core.windows.net/lake/landing/a.csv"),
        DataFile("b.csv", 32, "etag:0x8DC2", "https://acct.blob.core.windows.net/lake/landing/b.csv"),
    )
)
SNAPSHOT = f"retrain/snapshots/digits/{MANIFEST.version}/"
PATH = f"azureml://datastores/lakestore/paths/retrain/snapshots/digits/{MANIFEST.version}/"


def test_the_asset_is_the_snapshot_folder_versioned_by_the_data_version():
    data = build_data_asset("digits", MANIFEST, "lakestore", SNAPSHOT)
    assert (data.name, data.version, data.type, data.path) == (
        "digits-raw",
        MANIFEST.version,
        "uri_folder",
        PATH,
    )
    assert data.tags == {
        "retrain.raw_version": MANIFEST.version,
        "retrain.file_count": "2",
        "retrain.total_bytes": "42",
        "retrain.manifest": f"retrain/snapshots/digits/{MANIFEST.version}.manifest.json",
    }
    assert data._to_dict()["path"] == PATH
    assert data_asset_reference("digits", MANIFEST.version) == f"azureml:digits-raw:{MANIFEST.version}"


def test_registering_twice_creates_once():
    workspace = RecordingWorkspace()
    data = build_data_asset("digits", MANIFEST, "lakestore", SNAPSHOT)

    first = register_data_asset(workspace, data)
    second = register_data_asset(workspace, data)

    assert workspace.called("create_data") == [("digits-raw", MANIFEST.version)]
    assert first == second


def test_an_existing_version_at_the_long_form_of_the_same_path_is_reused():
    long_form = (
        f"azureml://subscriptions/s/resourcegroups/rg/workspaces/ws/datastores/lakestore/paths/{SNAPSHOT}"
    )
    workspace = RecordingWorkspace(
        data_assets={
            ("digits-raw", MANIFEST.version): AssetRecord("data", "digits-raw", MANIFEST.version, long_form)
        }
    )
    register_data_asset(workspace, build_data_asset("digits", MANIFEST, "lakestore", SNAPSHOT))
    assert workspace.called("create_data") == []


def test_a_data_version_never_names_two_snapshots():
    elsewhere = "azureml://datastores/other/paths/x/"
    workspace = RecordingWorkspace(
        data_assets={
            ("digits-raw", MANIFEST.version): AssetRecord("data", "digits-raw", MANIFEST.version, elsewhere)
        }
    )
    with pytest.raises(
        SubmissionError, match=rf"data asset digits-raw:{MANIFEST.version} already points at {elsewhere}"
    ):
        register_data_asset(workspace, build_data_asset("digits", MANIFEST, "lakestore", SNAPSHOT))
    assert workspace.called("create_data") == []
