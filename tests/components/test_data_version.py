"""Raw data versions: the same files give the same version, any change another; pins are immutable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.data_version import (
    DataError,
    DataFile,
    DataManifest,
    manifest_of_folder,
    snapshot_folder,
)
from core.objects import bytes_stored
from core.versions import MANIFEST_SUFFIX


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / "batch-1.csv").write_text("row_key,label\na,1\n")
    (folder / "batch-2.parquet").write_bytes(b"PAR1 not really parquet, but bytes are bytes")
    (folder / "notes.txt").write_text("not data")
    return folder


def test_the_same_files_give_the_same_version_wherever_they_lie(raw: Path, tmp_path: Path):
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    for path in raw.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    assert manifest_of_folder(raw).version == manifest_of_folder(copy).version


def test_only_raw_data_files_are_listed_with_their_content_hash(raw: Path):
    manifest = manifest_of_folder(raw)
    assert [file.name for file in manifest.files] == ["batch-1.csv", "batch-2.parquet"]
    assert all(file.fingerprint.startswith("sha256:") for file in manifest.files)
    assert manifest.version.startswith("rd-") and len(manifest.version) == 19


@pytest.mark.parametrize(
    "change",
    [
        lambda folder: (folder / "batch-1.csv").write_text("row_key,label\na,2\n"),
        lambda folder: (folder / "batch-3.csv").write_text("row_key,label\nb,1\n"),
        lambda folder: (folder / "batch-2.parquet").unlink(),
        lambda folder: (folder / "batch-1.csv").rename(folder / "batch-0.csv"),
    ],
    ids=["edited", "added", "removed", "renamed"],
)
def test_any_change_to_the_data_gives_another_version(raw: Path, change):
    before = manifest_of_folder(raw).version
    change(raw)
    assert manifest_of_folder(raw).version != before


def test_a_snapshot_is_an_immutable_copy_with_its_manifest_written_last(raw: Path, tmp_path: Path):
    manifest, folder = snapshot_folder(raw, tmp_path / "versions")
    assert folder == tmp_path / "versions" / manifest.version
    assert sorted(path.name for path in folder.iterdir()) == ["batch-1.csv", "batch-2.parquet"]
    written = (tmp_path / "versions" / f"{manifest.version}{MANIFEST_SUFFIX}").read_text()
    assert DataManifest.from_json(written) == manifest
    (raw / "batch-1.csv").write_text("row_key,label\na,9\n")
    assert (folder / "batch-1.csv").read_text() == "row_key,label\na,1\n"


def test_a_later_version_stores_only_the_files_no_earlier_one_pinned(raw: Path, tmp_path: Path):
    first, first_folder = snapshot_folder(raw, tmp_path / "versions")
    stored = bytes_stored(tmp_path)
    (raw / "batch-3.csv").write_text("row_key,label\nb,1\n" * 500)

    second, second_folder = snapshot_folder(raw, tmp_path / "versions")

    assert second.version != first.version
    grown = (
        bytes_stored(tmp_path) - stored - (raw / "batch-3.csv").stat().st_size
    )  # less the new landing file
    manifest_bytes = len(second.to_json())
    assert grown == (raw / "batch-3.csv").stat().st_size + manifest_bytes
    assert (second_folder / "batch-1.csv").stat().st_ino == (first_folder / "batch-1.csv").stat().st_ino


def test_snapshotting_the_same_data_again_reuses_the_version(raw: Path, tmp_path: Path):
    first, folder = snapshot_folder(raw, tmp_path / "versions")
    marker = folder.stat().st_mtime_ns
    second, again = snapshot_folder(raw, tmp_path / "versions")
    assert (second.version, again, again.stat().st_mtime_ns) == (first.version, folder, marker)
    assert [path.name for path in (tmp_path / "versions").iterdir() if path.name.startswith(".")] == []


def test_a_snapshot_interrupted_before_its_manifest_is_redone(raw: Path, tmp_path: Path):
    manifest = manifest_of_folder(raw)
    half = tmp_path / "versions" / manifest.version
    half.mkdir(parents=True)
    (half / "batch-1.csv").write_text("trunc")
    _, folder = snapshot_folder(raw, tmp_path / "versions")
    assert (folder / "batch-1.csv").read_text() == "row_key,label\na,1\n"
    assert (folder / "batch-2.parquet").exists()


def test_bad_input_gets_one_line_that_names_it(tmp_path: Path):
    with pytest.raises(DataError, match=r"--data .*absent: no such folder"):
        manifest_of_folder(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no \.csv or \.parquet files"):
        manifest_of_folder(tmp_path / "empty")
    with pytest.raises(DataError, match="fingerprint"):
        DataFile("a.csv", 1, "md5:abc", "file:///a.csv")


def test_a_tampered_manifest_is_refused(raw: Path):
    document = json.loads(manifest_of_folder(raw).to_json())
    document["files"][0]["size"] += 1
    with pytest.raises(DataError, match="says rd-"):
        DataManifest.from_json(json.dumps(document))
