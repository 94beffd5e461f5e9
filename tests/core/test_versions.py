"""core/versions.py: the raw-version formula, equal to the versions recorded before it moved here."""

from __future__ import annotations

from components.data_version import DataFile, DataManifest
from core.versions import is_raw_version, is_version, raw_version

# (entries, the version components/data_version.py and training/drift/data.py computed for them).
RECORDED = [
    ([("a.csv", 3, "sha256:" + "0" * 64)], "rd-aa82e6b88a74c6f5"),
    ([("b.csv", 10, "etag:0x8DC2"), ("a.csv", 5, "etag:0x8DC1")], "rd-7b97dacc53484c7d"),
]


def test_the_formula_gives_the_recorded_versions_in_any_order():
    for entries, version in RECORDED:
        assert raw_version(entries) == version
        assert raw_version(reversed(entries)) == version


def test_a_manifest_is_versioned_by_the_same_formula_and_not_by_where_files_came_from():
    for entries, version in RECORDED:
        files = tuple(
            DataFile(name, size, fingerprint, f"file:///x/{name}") for name, size, fingerprint in entries
        )
        moved = tuple(
            DataFile(name, size, fingerprint, f"https://elsewhere/{name}")
            for name, size, fingerprint in entries
        )
        assert DataManifest(files).version == DataManifest(moved).version == version


def test_the_version_forms():
    assert is_raw_version("rd-0123456789abcdef") and is_version("dv-0123456789abcdef")
    assert not is_raw_version("dv-0123456789abcdef")
    assert not any(
        is_version(text) for text in ("rd-0123", "RD-0123456789abcdef", "rd-0123456789abcdeg", None)
    )
