"""Data versions from Blob Storage, against the real Azurite emulator."""

from __future__ import annotations

import logging

import pytest

from components.blob_snapshot import (
    copy_snapshot,
    folder_prefix,
    manifest_of_blob_prefix,
    snapshot_blob_prefix,
    snapshot_paths,
)
from components.data_version import DataError, DataFile, DataManifest

CSV_A = b"id,x,label\n1,0.5,a\n2,0.7,b\n"
CSV_B = b"id,x,label\n3,0.1,a\n"


def _upload(container, name: str, data: bytes) -> None:
    container.get_blob_client(name).upload_blob(data, overwrite=True)


def _read(container, name: str) -> bytes:
    return container.get_blob_client(name).download_blob().readall()


@pytest.fixture
def landing(blob_container):
    _upload(blob_container, "landing/a.csv", CSV_A)
    _upload(blob_container, "landing/b.csv", CSV_B)
    return blob_container


def test_the_manifest_lists_raw_blobs_directly_under_the_prefix_by_etag(landing, caplog):
    _upload(landing, "landing/notes.txt", b"not data")
    _upload(landing, "landing/nested/c.csv", CSV_B)
    _upload(landing, "landing/empty.parquet", b"")
    _upload(landing, "landingzone/d.csv", CSV_B)

    with caplog.at_level(logging.WARNING):
        manifest = manifest_of_blob_prefix(landing, "landing")

    assert [file.name for file in manifest.files] == ["a.csv", "b.csv"]
    etag = landing.get_blob_client("landing/a.csv").get_blob_properties().etag.strip('"')
    assert manifest.files[0] == DataFile(
        "a.csv", len(CSV_A), f"etag:{etag}", landing.get_blob_client("landing/a.csv").url
    )
    assert manifest.version.startswith("rd-")
    assert "empty.parquet" in caplog.text


def test_the_version_changes_when_a_blob_is_rewritten_and_not_otherwise(landing):
    first = manifest_of_blob_prefix(landing, "landing/")
    assert manifest_of_blob_prefix(landing, "landing").version == first.version

    _upload(landing, "landing/b.csv", CSV_B)  # same bytes, new eTag: a new upload is a new version

    assert manifest_of_blob_prefix(landing, "landing").version != first.version


def test_a_prefix_without_data_is_a_one_line_error(blob_container):
    _upload(blob_container, "landing/empty.csv", b"")
    with pytest.raises(DataError, match=r"landing/: no non-empty \.csv or \.parquet blobs") as raised:
        manifest_of_blob_prefix(blob_container, "landing")
    assert "\n" not in str(raised.value)


def test_a_snapshot_copies_every_blob_and_writes_its_manifest_last(landing):
    manifest, snapshot = snapshot_blob_prefix(landing, "landing", "retrain/snapshots/digits")

    assert snapshot == f"retrain/snapshots/digits/{manifest.version}/"
    assert _read(landing, f"{snapshot}a.csv") == CSV_A
    assert _read(landing, f"{snapshot}b.csv") == CSV_B
    written = _read(landing, f"retrain/snapshots/digits/{manifest.version}.manifest.json").decode()
    assert DataManifest.from_json(written) == manifest


def test_a_second_snapshot_of_the_same_data_reuses_the_first(landing):
    manifest, snapshot = snapshot_blob_prefix(landing, "landing", "snapshots")
    copied = landing.get_blob_client(f"{snapshot}a.csv").get_blob_properties().etag

    again, snapshot_again = snapshot_blob_prefix(landing, "landing", "snapshots/")

    assert (again, snapshot_again) == (manifest, snapshot)
    assert landing.get_blob_client(f"{snapshot}a.csv").get_blob_properties().etag == copied


def test_new_data_gets_a_new_snapshot_beside_the_old_one(landing):
    old, old_snapshot = snapshot_blob_prefix(landing, "landing", "snapshots")
    _upload(landing, "landing/c.csv", CSV_B)

    new, new_snapshot = snapshot_blob_prefix(landing, "landing", "snapshots")

    assert new.version != old.version
    assert [file.name for file in new.files] == ["a.csv", "b.csv", "c.csv"]
    assert _read(landing, f"{new_snapshot}c.csv") == CSV_B
    assert not landing.get_blob_client(f"{old_snapshot}c.csv").exists()


def test_a_blob_replaced_mid_snapshot_fails_it_without_marking_it_complete(landing):
    manifest = manifest_of_blob_prefix(landing, "landing")
    _upload(landing, "landing/b.csv", b"id,x,label\n9,9.9,z\n")  # replaced after it was listed

    with pytest.raises(DataError, match=r"b\.csv: changed while the data was being snapshotted") as raised:
        copy_snapshot(landing, manifest, "snapshots")

    assert "\n" not in str(raised.value)
    _, manifest_name = snapshot_paths("snapshots", manifest.version)
    assert not landing.get_blob_client(manifest_name).exists()


def test_a_blob_deleted_mid_snapshot_fails_it(landing):
    manifest = manifest_of_blob_prefix(landing, "landing")
    landing.get_blob_client("landing/a.csv").delete_blob()

    with pytest.raises(DataError, match=r"a\.csv: deleted while the data was being snapshotted"):
        copy_snapshot(landing, manifest, "snapshots")


def test_an_interrupted_snapshot_is_completed_by_the_next_one(landing):
    manifest = manifest_of_blob_prefix(landing, "landing")
    folder, manifest_name = snapshot_paths("snapshots", manifest.version)
    _upload(landing, f"{folder}a.csv", b"partial")  # a copy left behind, with no manifest yet

    assert copy_snapshot(landing, manifest, "snapshots") == folder
    assert _read(landing, f"{folder}a.csv") == CSV_A
    assert landing.get_blob_client(manifest_name).exists()


def test_prefixes_name_folders():
    assert folder_prefix("/landing/digits") == "landing/digits/"
    assert folder_prefix("") == ""
    with pytest.raises(DataError, match="snapshots prefix is empty"):
        snapshot_paths("/", "rd-0123456789abcdef")
