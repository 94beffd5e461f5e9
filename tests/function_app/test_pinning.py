"""Pinning a batch from a local landing folder: the embedded twin of the eTag-conditioned blob download."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.data_version import DataFile, DataManifest
from function_app.pinning import LandingFolderCopy, PinError, content_etag

URL = "http://127.0.0.1:10000/devstoreaccount1/landing/incoming/"


def manifest_of(folder: Path, *names: str) -> DataManifest:
    files = [
        DataFile(name, (folder / name).stat().st_size, f"etag:{content_etag(folder / name)}", URL + name)
        for name in names
    ]
    return DataManifest(tuple(files))


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / "batch-0001.csv").write_text("pixel_0,label\n1,2\n")
    (folder / "batch-0002.csv").write_text("pixel_0,label\n3,4\n")
    return folder


def test_the_listed_versions_are_copied_into_an_immutable_snapshot_with_its_manifest(landing, tmp_path):
    manifest = manifest_of(landing, "batch-0001.csv", "batch-0002.csv")
    state = tmp_path / "state"

    ref = LandingFolderCopy(landing, state).pin(manifest, "digits")

    snapshot = Path(ref.uri)
    assert ref.version == manifest.version
    assert snapshot == state / "data" / "digits" / manifest.version
    assert sorted(path.name for path in snapshot.iterdir()) == ["batch-0001.csv", "batch-0002.csv"]
    assert (snapshot / "batch-0002.csv").read_text() == "pixel_0,label\n3,4\n"
    assert (
        DataManifest.from_json((snapshot.parent / f"{manifest.version}.manifest.json").read_text())
        == manifest
    )


def test_a_file_changed_since_its_event_fails_the_pin_and_leaves_no_snapshot(landing, tmp_path):
    manifest = manifest_of(landing, "batch-0001.csv", "batch-0002.csv")
    (landing / "batch-0002.csv").write_text("pixel_0,label\n5,6\n")  # a newer upload of the same name
    state = tmp_path / "state"

    with pytest.raises(PinError, match=r"batch-0002\.csv: changed since its event"):
        LandingFolderCopy(landing, state).pin(manifest, "digits")

    assert list((state / "data" / "digits").iterdir()) == []


def test_a_file_gone_since_its_event_fails_the_pin(landing, tmp_path):
    manifest = manifest_of(landing, "batch-0001.csv")
    (landing / "batch-0001.csv").unlink()

    with pytest.raises(PinError, match=r"batch-0001\.csv: gone since its event"):
        LandingFolderCopy(landing, tmp_path / "state").pin(manifest, "digits")


def test_a_pinned_version_is_not_copied_again(landing, tmp_path):
    manifest = manifest_of(landing, "batch-0001.csv")
    pinner = LandingFolderCopy(landing, tmp_path / "state")
    first = pinner.pin(manifest, "digits")
    (landing / "batch-0001.csv").unlink()  # a second pin must not need the landing file any more

    assert pinner.pin(manifest, "digits") == first
