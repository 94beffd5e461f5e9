"""Collection of a model's blob store on Azurite: a version goes when nothing keeps it, an object when no
remaining version names it, and never what a kept version, a version in use or the latest names."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from components.azureml.blob_retention import collect_blob_store
from components.azureml.blob_snapshot import snapshot_blob_prefix, snapshot_paths
from components.errors import PipelineError

SNAPSHOTS = "retrain/snapshots/digits"
STORE = f"{SNAPSHOTS}/store/"
LATER = datetime.now(UTC) + timedelta(days=2)  # as if the grace had passed since every pin of the test


def _upload(container, name: str, data: bytes) -> None:
    container.get_blob_client(name).upload_blob(data, overwrite=True)


def _objects(container, version: str) -> set[str]:
    text = container.get_blob_client(f"{STORE}{version}.manifest.json").download_blob().readall()
    return set(json.loads(text)["objects"].values())


def _present(container, prefix: str) -> set[str]:
    return {blob.name[len(prefix) :] for blob in container.list_blobs(name_starts_with=prefix)}


@pytest.fixture
def versions(blob_container):
    """Four versions: a.csv throughout, then b.csv replaced twice (each earlier b held by one version only),
    then c.csv added."""
    _upload(blob_container, "landing/a.csv", b"id,x\n1,0.5\n")
    pinned = []
    for step, data in enumerate((b"id,x\n2,0.1\n", b"id,x\n2,0.2\n", b"id,x\n2,0.3\n")):
        _upload(blob_container, "landing/b.csv", data)
        pinned.append(snapshot_blob_prefix(blob_container, "landing", SNAPSHOTS)[0].version)
        assert len(pinned) == step + 1
    _upload(blob_container, "landing/c.csv", b"id,x\n3,0.9\n")
    pinned.append(snapshot_blob_prefix(blob_container, "landing", SNAPSHOTS)[0].version)
    return pinned


def test_a_version_nothing_keeps_goes_and_then_the_objects_only_it_named(blob_container, versions):
    first, second, third, fourth = versions
    only_first = _objects(blob_container, first) - _objects(blob_container, second)
    in_use = {second: "an unfinished submission"}

    done = collect_blob_store(blob_container, SNAPSHOTS, in_use, keep=1, now=LATER)

    assert [pinned.version for pinned in done.removed] == [third, first]
    assert {pinned.version: why for pinned, why in done.kept} == {
        fourth: "the store's latest (what a scheduled job reads)",
        second: "an unfinished submission",
    }
    present = _present(blob_container, f"{STORE}objects/")
    assert present == _objects(blob_container, second) | _objects(blob_container, fourth)
    assert not only_first & present
    # Only the first version's b.csv goes: the third's is the fourth's too, and a.csv is everyone's.
    assert (done.objects, done.bytes) == (1, len(b"id,x\n2,0.1\n"))
    assert not blob_container.get_blob_client(f"{STORE}{first}.manifest.json").exists()


def test_a_dry_run_says_what_would_go_and_removes_nothing(blob_container, versions):
    before = _present(blob_container, STORE)

    done = collect_blob_store(blob_container, SNAPSHOTS, {}, keep=2, now=LATER, dry_run=True)

    assert [pinned.version for pinned in done.removed] == [versions[1], versions[0]]
    assert done.objects == 2  # the b.csv of each
    assert _present(blob_container, STORE) == before


def test_a_young_object_no_version_names_yet_is_kept(blob_container, versions):
    _upload(blob_container, f"{STORE}objects/etag-{'0' * 40}-5", b"12345")  # a pin in progress

    done = collect_blob_store(blob_container, SNAPSHOTS, {}, keep=4)

    assert (done.removed, done.objects) == ((), 0)
    assert f"etag-{'0' * 40}-5" in _present(blob_container, f"{STORE}objects/")
    assert collect_blob_store(blob_container, SNAPSHOTS, {}, keep=4, now=LATER).objects == 1


@pytest.fixture
def full_copy(blob_container):
    """A version pinned as a full copy (a folder of files), asked for before `versions`: the oldest pin,
    whatever second each blob's Last-Modified falls in (a tie goes by version, and this one is the least)."""
    folder, manifest_name = snapshot_paths(SNAPSHOTS, "rd-00000000000000aa")
    _upload(blob_container, f"{folder}a.csv", b"id,x\n1,0.5\n")
    _upload(blob_container, manifest_name, b"{}")  # its content is not read: its name says the version
    return folder, manifest_name


def test_a_version_pinned_as_a_full_copy_goes_with_its_folder(blob_container, full_copy, versions):
    folder, manifest_name = full_copy

    done = collect_blob_store(blob_container, SNAPSHOTS, {}, keep=2, now=LATER)

    assert "rd-00000000000000aa" in [pinned.version for pinned in done.removed]
    assert not list(blob_container.list_blobs(name_starts_with=folder))
    assert not blob_container.get_blob_client(manifest_name).exists()
    with pytest.raises(PipelineError, match=r"^--keep 0: expected a whole number of at least 1"):
        collect_blob_store(blob_container, SNAPSHOTS, {}, keep=0)
