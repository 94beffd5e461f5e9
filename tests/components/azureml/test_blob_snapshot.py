"""Data versions from Blob Storage, against the real Azurite emulator: each blob's bytes copied once into the
model's object store, a version its manifest. Server-side copies are counted on the wire (every request a
client sends passes its `raw_request_hook`), with nothing of ours stood in for."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from azure.storage.blob import BlobBlock

from components.azureml.blob_snapshot import (
    copy_snapshot,
    folder_prefix,
    manifest_of_blob_prefix,
    snapshot_blob_prefix,
    snapshot_paths,
    store_paths,
)
from components.data_version import DataError, DataFile, DataManifest
from components.specs import REPO_ROOT
from core.errors import InputError
from core.pinned_store import version_folder

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


SNAPSHOTS = "retrain/snapshots/digits"
STORE = f"{SNAPSHOTS}/store/"
OBJECTS = f"{STORE}objects/"


class CopyCounter:
    """A client of the test's container whose every request passes `seen`: the server-side copies it asks
    for are the requests that carry `x-ms-copy-source`, counted as Storage receives them. `before_copy`, if
    set, runs as a copy of that source goes out (after the pin has listed it)."""

    def __init__(self, azurite, container_name: str) -> None:
        self.sources: list[str] = []
        self.before_copy: dict[str, object] = {}
        self.client = azurite.service_client(raw_request_hook=self.seen).get_container_client(container_name)

    def seen(self, request) -> None:
        source = request.http_request.headers.get("x-ms-copy-source")
        if source is not None:
            name = source.split(f"/{self.client.container_name}/", 1)[1]
            self.sources.append(name)
            action = self.before_copy.pop(name, None)
            if action is not None:
                action()

    def take(self) -> list[str]:
        taken, self.sources = sorted(self.sources), []
        return taken


@pytest.fixture
def counted(azurite, landing) -> CopyCounter:
    return CopyCounter(azurite, landing.container_name)


def _stored_bytes(container, prefix: str = "retrain/snapshots/") -> int:
    return sum(blob.size for blob in container.list_blobs(name_starts_with=prefix))


def _upload_in_blocks(container, name: str, data: bytes) -> None:
    """A block-list upload, as large files and many tools make: Storage then holds no Content-MD5."""
    blob = container.get_blob_client(name)
    blob.stage_block("YmxvY2stMQ==", data)
    blob.commit_block_list([BlobBlock("YmxvY2stMQ==")])


def _batch(number: int, rows: int = 600) -> bytes:
    lines = "".join(
        f"{number}-{row},{(number * rows + row) % 97 / 97:.6f},{'ab'[row % 2]}\n" for row in range(rows)
    )
    return f"id,x,label\n{lines}".encode()


def test_a_snapshot_keeps_each_blob_once_in_the_store_and_writes_its_manifest_last(landing, counted):
    _upload_in_blocks(landing, "landing/c.csv", CSV_B + b"4,0.2,b\n")

    manifest, snapshot = snapshot_blob_prefix(counted.client, "landing", SNAPSHOTS)

    assert (snapshot.folder, snapshot.manifest_name) == store_paths(SNAPSHOTS, manifest.version)
    assert snapshot.folder == STORE
    document = json.loads(_read(landing, snapshot.manifest_name))
    assert DataManifest.from_json(json.dumps(document)) == manifest
    objects = document["objects"]
    # a.csv and b.csv were put whole, so Storage has their MD5; c.csv was put in blocks: its name and eTag.
    assert objects["a.csv"] == f"md5-{hashlib.md5(CSV_A).hexdigest()}-{len(CSV_A)}"
    assert objects["b.csv"] == f"md5-{hashlib.md5(CSV_B).hexdigest()}-{len(CSV_B)}"
    assert objects["c.csv"].startswith("etag-") and objects["c.csv"].endswith(f"-{len(CSV_B) + 8}")
    for name, data in (("a.csv", CSV_A), ("b.csv", CSV_B)):
        assert _read(landing, f"{OBJECTS}{objects[name]}") == data
    assert counted.take() == ["landing/a.csv", "landing/b.csv", "landing/c.csv"]
    assert _read(landing, f"{STORE}latest").decode().strip() == manifest.version
    # Written last: the manifest is the newest blob of the store but the pointer to it.
    written = {blob.name: blob.last_modified for blob in landing.list_blobs(name_starts_with=STORE)}
    assert max(written[f"{OBJECTS}{key}"] for key in objects.values()) <= written[snapshot.manifest_name]


def test_a_second_snapshot_of_the_same_data_reuses_the_first_and_copies_nothing(landing, counted):
    manifest, snapshot = snapshot_blob_prefix(counted.client, "landing", SNAPSHOTS)
    pinned = landing.get_blob_client(snapshot.manifest_name).get_blob_properties().etag
    counted.take()

    again, snapshot_again = snapshot_blob_prefix(counted.client, "landing", f"{SNAPSHOTS}/")

    assert (again, snapshot_again.folder, snapshot_again.copied) == (manifest, snapshot.folder, ())
    assert counted.take() == []
    assert landing.get_blob_client(snapshot.manifest_name).get_blob_properties().etag == pinned


def test_one_percent_new_blobs_copy_only_those_and_store_little_more_than_their_bytes(landing, counted):
    """Issue 42: a version costs what its new data costs. 200 batches (half put whole, half in blocks, so
    both kinds of object key), then 2 more: the second pin copies exactly the 2 new blobs, and the bytes
    stored under the snapshots grow by at most 4x their raw bytes plus a few MB."""
    for number in range(2, 202):
        upload = _upload if number % 2 else _upload_in_blocks
        upload(landing, f"landing/batch-{number:03d}.csv", _batch(number))
    first, _ = snapshot_blob_prefix(counted.client, "landing", SNAPSHOTS)
    assert len(counted.take()) == len(first.files) == 202
    stored_before = _stored_bytes(landing)

    new = {"landing/batch-202.csv": _batch(202), "landing/batch-203.csv": _batch(203)}
    _upload(landing, "landing/batch-202.csv", new["landing/batch-202.csv"])
    _upload_in_blocks(landing, "landing/batch-203.csv", new["landing/batch-203.csv"])
    second, snapshot = snapshot_blob_prefix(counted.client, "landing", SNAPSHOTS)

    assert second.version != first.version and len(second.files) == 204
    assert counted.take() == sorted(new)  # the server-side copies: the new blobs, and nothing else
    assert len(snapshot.copied) == 2
    new_bytes = sum(len(data) for data in new.values())
    assert new_bytes / second.total_bytes < 0.011  # ~1 % new data
    grown = _stored_bytes(landing) - stored_before
    assert new_bytes <= grown <= 4 * new_bytes + 4 * 2**20
    # What a job downloading the store would fetch, which chooses its input mode: every object in it.
    objects = landing.list_blobs(name_starts_with=OBJECTS)
    assert snapshot.folder_bytes == sum(blob.size for blob in objects)
    # The first version is intact beside the second: each names its own objects, all still there.
    for version in (first.version, second.version):
        objects = json.loads(_read(landing, f"{STORE}{version}.manifest.json"))["objects"]
        assert all(landing.get_blob_client(f"{OBJECTS}{key}").exists() for key in objects.values())


def test_the_same_bytes_uploaded_again_are_not_copied_again_when_storage_has_their_md5(landing, counted):
    first, _ = snapshot_blob_prefix(counted.client, "landing", SNAPSHOTS)
    _upload(landing, "landing/b.csv", CSV_B)  # a new eTag, a new version: the same bytes
    _upload(landing, "landing/b-copy.csv", CSV_B)  # and the same bytes under another name
    counted.take()

    second, snapshot = snapshot_blob_prefix(counted.client, "landing", SNAPSHOTS)

    assert second.version != first.version
    assert (counted.take(), snapshot.copied) == ([], ())


def test_a_blob_without_md5_is_kept_under_its_etag_and_copied_again_when_put_again(landing, counted):
    _upload_in_blocks(landing, "landing/c.csv", CSV_A)
    snapshot_blob_prefix(counted.client, "landing", SNAPSHOTS)
    _upload_in_blocks(landing, "landing/c.csv", CSV_A)  # the same bytes, but nothing tells them the same
    counted.take()

    snapshot_blob_prefix(counted.client, "landing", SNAPSHOTS)

    assert counted.take() == ["landing/c.csv"]


def test_a_blob_replaced_mid_snapshot_fails_it_without_marking_it_complete(landing):
    manifest = manifest_of_blob_prefix(landing, "landing")
    _upload(landing, "landing/b.csv", b"id,x,label\n9,9.9,z\n")  # replaced after it was listed

    with pytest.raises(DataError, match=r"b\.csv: changed while the data was being snapshotted") as raised:
        copy_snapshot(landing, manifest, SNAPSHOTS)

    assert "\n" not in str(raised.value)
    _, manifest_name = store_paths(SNAPSHOTS, manifest.version)
    assert not landing.get_blob_client(manifest_name).exists()


def test_a_blob_replaced_between_the_pins_listing_and_its_copy_fails_the_pin(landing, counted):
    """The copy itself is conditional on the listed eTag: b.csv is replaced as its copy request goes out,
    after the pin listed it unchanged, and Storage refuses the copy."""
    manifest = manifest_of_blob_prefix(landing, "landing")
    counted.before_copy["landing/b.csv"] = lambda: _upload(landing, "landing/b.csv", b"id,x,label\n9,9.9,z\n")

    with pytest.raises(DataError, match=r"b\.csv: changed while the data was being snapshotted") as raised:
        copy_snapshot(counted.client, manifest, SNAPSHOTS)

    assert "\n" not in str(raised.value)
    assert "landing/b.csv" in counted.take()  # the copy was asked for, and refused
    _, manifest_name = store_paths(SNAPSHOTS, manifest.version)
    assert not landing.get_blob_client(manifest_name).exists()
    assert not landing.get_blob_client(f"{STORE}latest").exists()


def test_a_blob_deleted_mid_snapshot_fails_it(landing):
    manifest = manifest_of_blob_prefix(landing, "landing")
    landing.get_blob_client("landing/a.csv").delete_blob()

    with pytest.raises(DataError, match=r"a\.csv: deleted while the data was being snapshotted"):
        copy_snapshot(landing, manifest, SNAPSHOTS)


def test_an_interrupted_snapshot_is_completed_by_the_next_one(landing, counted):
    manifest = manifest_of_blob_prefix(landing, "landing")
    key = f"md5-{hashlib.md5(CSV_A).hexdigest()}-{len(CSV_A)}"
    _upload(landing, f"{OBJECTS}{key}", b"partial")  # a stray write where a.csv's object goes, no manifest

    snapshot = copy_snapshot(counted.client, manifest, SNAPSHOTS)

    assert _read(landing, f"{OBJECTS}{key}") == CSV_A
    assert counted.take() == ["landing/a.csv", "landing/b.csv"]
    assert landing.get_blob_client(snapshot.manifest_name).exists()


def test_a_version_whose_objects_are_gone_is_pinned_again(landing, counted):
    manifest, snapshot = snapshot_blob_prefix(counted.client, "landing", SNAPSHOTS)
    key = json.loads(_read(landing, snapshot.manifest_name))["objects"]["b.csv"]
    landing.get_blob_client(f"{OBJECTS}{key}").delete_blob()
    counted.take()

    again = copy_snapshot(counted.client, manifest, SNAPSHOTS)

    assert (counted.take(), again.copied) == (["landing/b.csv"], (key,))
    assert _read(landing, f"{OBJECTS}{key}") == CSV_B


def test_a_version_pinned_as_a_full_copy_before_the_store_is_reused_as_it_is(landing, counted):
    manifest = manifest_of_blob_prefix(landing, "landing")
    folder, manifest_name = snapshot_paths(SNAPSHOTS, manifest.version)
    for entry in manifest.files:
        _upload(landing, f"{folder}{entry.name}", _read(landing, f"landing/{entry.name}"))
    _upload(landing, manifest_name, manifest.to_json().encode())

    snapshot = copy_snapshot(counted.client, manifest, SNAPSHOTS)

    assert (snapshot.folder, snapshot.manifest_name) == (folder, manifest_name)
    assert counted.take() == [] and not list(landing.list_blobs(name_starts_with=STORE))


def _download(container, prefix: str, into: Path) -> Path:
    """The store as Azure ML's download mode lays it out on a node: every blob below the prefix, as a file."""
    for blob in container.list_blobs(name_starts_with=prefix):
        path = into / blob.name[len(prefix) :]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_read(container, blob.name))
    return into


def test_a_job_reads_a_version_of_the_store_as_a_folder_of_its_files(landing, tmp_path):
    old, _ = snapshot_blob_prefix(landing, "landing", SNAPSHOTS)
    _upload(landing, "landing/c.csv", CSV_A + b"5,0.3,a\n")
    new, _ = snapshot_blob_prefix(landing, "landing", SNAPSHOTS)
    store = _download(landing, STORE, tmp_path / "store")

    for asked, manifest in ((old.version, old), ("latest", new), (new.version, new)):
        with version_folder(store, asked) as folder:
            found = {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*.csv")}
            assert folder.name == manifest.version
            assert found == {entry.name: _read(landing, f"landing/{entry.name}") for entry in manifest.files}
    plain = tmp_path / "plain"
    plain.mkdir()
    with version_folder(plain, old.version) as folder:  # a folder of the files themselves is read as it is
        assert folder == plain


def test_a_version_whose_object_is_missing_on_the_node_fails_in_one_line(landing, tmp_path):
    manifest, snapshot = snapshot_blob_prefix(landing, "landing", SNAPSHOTS)
    store = _download(landing, STORE, tmp_path / "store")
    key = json.loads(_read(landing, snapshot.manifest_name))["objects"]["b.csv"]
    (store / "objects" / key).unlink()

    with pytest.raises(InputError, match=rf"b\.csv's object {key} is missing in the store; ") as raised:
        _open_version(store, manifest.version)
    assert "\n" not in str(raised.value)
    with pytest.raises(InputError, match=r"^--raw-version rd-1: expected a raw data version rd-<16 hex>"):
        _open_version(store, "rd-1")
    with pytest.raises(InputError, match=r"rd-0000000000000000\.manifest\.json: no such file; expected"):
        _open_version(store, "rd-0000000000000000")


def _open_version(store: Path, version: str) -> None:
    with version_folder(store, version):
        pass  # reached only when the version's folder could be laid out


def test_the_prep_step_prepares_a_version_of_the_store_as_it_prepares_its_files(blob_container, tmp_path):
    """prep.yml's command as Azure ML runs it on a downloaded store (--raw the store, --raw-version the
    version) prepares the same data version as the version's files in a folder of their own."""
    files = tmp_path / "files"
    files.mkdir()
    for number in (1, 2):
        (files / f"batch-{number}.csv").write_bytes(_sample_batch(tmp_path, number))
        _upload(blob_container, f"landing/batch-{number}.csv", _sample_batch(tmp_path, number))
    manifest, _ = snapshot_blob_prefix(blob_container, "landing", SNAPSHOTS)
    _upload(blob_container, "landing/batch-3.csv", _sample_batch(tmp_path, 3))  # later: not in the version
    snapshot_blob_prefix(blob_container, "landing", SNAPSHOTS)
    store = _download(blob_container, STORE, tmp_path / "store")

    from_store = _prepared_version(tmp_path / "from-store", "--raw", store, "--raw-version", manifest.version)
    from_files = _prepared_version(tmp_path / "from-files", "--raw", files)

    assert from_store == from_files


def _prepared_version(out: Path, *flags: object) -> str:
    """`retrain prepare` as a step runs it: the prepared data version it reports."""
    result = subprocess.run(
        [sys.executable, "-m", "training.cli", "prepare", *map(str, flags), "--out", str(out / "prepared"),
         "--rejected", str(out / "rejected")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((out / "rejected" / "rejected.json").read_text())["files"] == []
    (version,) = re.findall(r"prepared data version (dv-[0-9a-f]{16}) in ", result.stderr + result.stdout)
    return version


def _sample_batch(tmp_path: Path, number: int) -> bytes:
    """One of the bundled digits' batch files (`retrain sample-data`), written once per test."""
    folder = tmp_path / "sample"
    if not folder.is_dir():
        subprocess.run(
            [sys.executable, "-m", "training.cli", "sample-data", "--out", str(folder), "--batches", "3"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
    return sorted(folder.glob("*.csv"))[number - 1].read_bytes()


def test_prefixes_name_folders():
    assert folder_prefix("/landing/digits") == "landing/digits/"
    assert folder_prefix("") == ""
    for paths in (snapshot_paths, store_paths):
        with pytest.raises(DataError, match="snapshots prefix is empty"):
            paths("/", "rd-0123456789abcdef")
