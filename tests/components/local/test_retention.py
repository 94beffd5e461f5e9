"""Retention of pinned raw versions: what nothing needs goes, with the bytes only it held; what is kept, named
in use, or among the newest stays whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.data_version import check_pinned, data_objects, snapshot_folder
from components.errors import PipelineError
from components.local.retention import collect, pinned_versions

BASE = "row_key,label\n" + "".join(f"b{row},{row % 10}\n" for row in range(200))


def pin_five(tmp_path: Path) -> tuple[Path, list[str], dict[str, str]]:
    """Five versions of 'digits': one shared file, and a batch file that each version replaces. Returns the
    data root, the versions oldest first, and each version's own batch file's sha256."""
    landing, data_root = tmp_path / "landing", tmp_path / "state" / "data"
    landing.mkdir()
    (landing / "base.csv").write_text(BASE)
    versions, own = [], {}
    for number in range(1, 6):
        (landing / "batch.csv").write_text(f"row_key,label\nn{number},{number}\n" * 50)
        manifest, folder = snapshot_folder(landing, data_root / "digits")
        os.utime(folder.with_name(f"{manifest.version}.manifest.json"), (number * 1000, number * 1000))
        versions.append(manifest.version)
        own[manifest.version] = next(f for f in manifest.files if f.name == "batch.csv").fingerprint[7:]
    return data_root, versions, own


def test_collection_removes_what_nothing_needs_and_keeps_each_kind_of_named_version(tmp_path: Path):
    data_root, (v1, v2, v3, v4, v5), own = pin_five(tmp_path)
    objects = data_objects(data_root / "digits")
    in_use = {"digits": {v1: "registered as digits v1", v3: "submission s-1 is Running"}}

    done = collect(data_root, in_use, keep=1)

    assert [pinned.version for pinned in done.removed] == [v4, v2]
    assert {pinned.version: why for pinned, why in done.kept} == {
        v5: "among the 1 newest pins of digits",
        v3: "submission s-1 is Running",
        v1: "registered as digits v1",
    }
    assert (done.objects.objects, done.objects.bytes) == (2, 2 * len("row_key,label\nn2,2\n" * 50))
    assert not objects.holds(own[v2]) and not objects.holds(own[v4])  # only the removed versions held them
    for version in (v1, v3, v5):
        assert objects.holds(own[version])
        check_pinned(data_root / "digits" / version)  # every kept version is whole
    assert [pinned.version for pinned in pinned_versions(data_root)] == [v5, v3, v1]
    assert (
        not (data_root / "digits" / v2).exists()
        and not (data_root / "digits" / f"{v2}.manifest.json").exists()
    )


def test_a_dry_run_says_the_same_and_removes_nothing(tmp_path: Path):
    data_root, (v1, v2, v3, v4, v5), own = pin_five(tmp_path)

    said = collect(data_root, {}, keep=2, dry_run=True)

    assert [pinned.version for pinned in said.removed] == [v3, v2, v1]
    assert said.objects.objects == 3
    assert [pinned.version for pinned in pinned_versions(data_root)] == [v5, v4, v3, v2, v1]
    assert all(data_objects(data_root / "digits").holds(digest) for digest in own.values())
    done = collect(data_root, {}, keep=2)
    assert [pinned.version for pinned in done.removed] == [v3, v2, v1] and done.objects == said.objects


def test_a_version_pinned_again_counts_as_new(tmp_path: Path):
    data_root, (v1, *_), _ = pin_five(tmp_path)
    landing = tmp_path / "landing"
    (landing / "batch.csv").write_text("row_key,label\nn1,1\n" * 50)  # the first version's data, once more

    manifest, _ = snapshot_folder(landing, data_root / "digits")

    assert manifest.version == v1
    done = collect(data_root, {}, keep=1)
    assert [pinned.version for pinned, _ in done.kept] == [v1]
    assert v1 not in {pinned.version for pinned in done.removed}


def test_keeping_no_pin_is_refused_in_one_line(tmp_path: Path):
    data_root, versions, _ = pin_five(tmp_path)
    with pytest.raises(PipelineError, match=r"--keep 0: expected a whole number of at least 1"):
        collect(data_root, {}, keep=0)
    assert len(pinned_versions(data_root)) == len(versions)
