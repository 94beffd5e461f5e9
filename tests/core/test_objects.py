"""The local object store: each file's bytes kept once, folders of hard links into it, and collection of what
no folder links any more."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from core.objects import ObjectMismatch, ObjectStore, bytes_stored


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_two_folders_hold_is_stored_once_and_read_only(tmp_path: Path):
    store = ObjectStore(tmp_path / "objects")
    with store.writing():
        digest = store.put_bytes(b"a,b\n1,2\n")
        assert store.put_bytes(b"a,b\n1,2\n") == digest == sha256(b"a,b\n1,2\n")
        store.link(digest, tmp_path / "v1" / "batch.csv")
        store.link(digest, tmp_path / "v2" / "batch.csv")

    assert (tmp_path / "v2" / "batch.csv").read_bytes() == b"a,b\n1,2\n"
    assert bytes_stored(tmp_path) == len(b"a,b\n1,2\n")
    assert not os.stat(tmp_path / "v1" / "batch.csv").st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def test_collection_removes_exactly_the_objects_no_folder_links(tmp_path: Path):
    store = ObjectStore(tmp_path / "objects")
    with store.writing():
        kept = store.put_bytes(b"kept")
        gone = store.put_bytes(b"gone")
        store.set_alias("https://account/landing/gone.csv#etag:0x1", gone)
        store.link(kept, tmp_path / "v1" / "kept.csv")
        store.link(gone, tmp_path / "v1" / "gone.csv")
        store.link(kept, tmp_path / "v2" / "kept.csv")

    shutil.rmtree(tmp_path / "v1")
    collected = store.collect()

    assert (collected.objects, collected.bytes, collected.aliases) == (1, len(b"gone"), 1)
    assert store.holds(kept) and not store.holds(gone)
    assert store.alias("https://account/landing/gone.csv#etag:0x1") is None
    assert (tmp_path / "v2" / "kept.csv").read_bytes() == b"kept"


def test_a_writer_between_finding_an_object_and_linking_it_never_loses_it_to_a_collection(tmp_path: Path):
    store = ObjectStore(tmp_path / "objects")
    with store.writing():
        digest = store.put_bytes(b"unlinked for now")
    results = []
    with store.writing():
        assert store.holds(digest)  # found: the pin will link it, not fetch it again
        collector = threading.Thread(target=lambda: results.append(store.collect()))
        collector.start()  # waits for the writer, whatever the scheduler does
        store.link(digest, tmp_path / "v1" / "file.csv")
    collector.join()

    assert results[0].objects == 0 and store.holds(digest)
    assert (tmp_path / "v1" / "file.csv").read_bytes() == b"unlinked for now"


def test_bytes_that_are_not_the_expected_ones_are_refused_and_nothing_is_kept(tmp_path: Path):
    store = ObjectStore(tmp_path / "objects")
    source = tmp_path / "batch.csv"
    source.write_bytes(b"written since it was listed")

    with pytest.raises(ObjectMismatch, match="expected"):
        store.put_file(source, expected=sha256(b"what was listed"))

    assert list((tmp_path / "objects").rglob("*.tmp")) == [] and not list(
        (tmp_path / "objects").glob("sha256/*/*")
    )


def test_a_damaged_object_is_never_linked_again_the_next_put_of_its_bytes_replaces_it(tmp_path: Path):
    store = ObjectStore(tmp_path / "objects")
    data = b"row_key,label\na,1\n"
    with store.writing():
        digest = store.put_bytes(data)
        store.link(digest, tmp_path / "v1" / "a.csv")
    damaged = tmp_path / "v1" / "a.csv"
    damaged.chmod(0o644)
    damaged.write_bytes(b"row_key,label\na,9\n")  # in place: the object's inode itself (root ignores modes)
    assert not store.verify(digest)
    source = tmp_path / "a.csv"
    source.write_bytes(data)

    assert store.put_file(source, expected=digest) == digest

    assert store.verify(digest) and store.path(digest).read_bytes() == data
    assert damaged.read_bytes() == b"row_key,label\na,9\n"  # the folder that linked it finds it by its check


def test_a_folder_on_another_file_system_gets_a_copy_of_the_object(tmp_path: Path):
    elsewhere = Path("/dev/shm")
    if os.stat(elsewhere).st_dev == os.stat(tmp_path).st_dev:
        pytest.fail("this test needs /dev/shm on another file system than the test's folder")
    store = ObjectStore(tmp_path / "objects")
    with store.writing():
        digest = store.put_bytes(b"copied across devices")
    target = elsewhere / f"retrain-test-{os.getpid()}-{tmp_path.name}" / "a.csv"
    try:
        store.link(digest, target)
        assert target.read_bytes() == b"copied across devices"
        assert os.stat(store.path(digest)).st_nlink == 1  # not linked: collection would free it
    finally:
        shutil.rmtree(target.parent, ignore_errors=True)


def test_a_digest_that_is_not_a_sha256_never_names_a_path(tmp_path: Path):
    store = ObjectStore(tmp_path / "objects")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.path("../../etc/passwd")
