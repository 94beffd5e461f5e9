from __future__ import annotations

import dataclasses
import json

import pytest

from core.errors import InputError
from training.data.splits import SplitFractions
from training.tasks.tabular.manifest import Manifest
from training.tasks.tabular.schema import TableSchema


@pytest.mark.parametrize(
    ("fractions", "message"),
    [
        ((0.9, 0.1, 0.0), r"test=0.0 is out of range; expected a number between 0 and 1"),
        ((0.7, 0.2, 0.2), r"add up to 1.1"),
        ((1.2, -0.1, -0.1), r"train=1.2 is out of range"),
    ],
)
def test_split_fractions_are_validated(fractions, message):
    with pytest.raises(InputError, match=message):
        SplitFractions(*fractions)


def test_split_fractions_parse_three_numbers():
    assert SplitFractions.parse("0.7,0.2,0.1") == SplitFractions(0.7, 0.2, 0.1)
    with pytest.raises(InputError, match=r"is not three numbers; expected TRAIN,VALIDATION,TEST"):
        SplitFractions.parse("0.8,0.2")


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (("id", "y", ("id",), 10), r"names column 'id' twice"),
        (("id", "y", ("source_row",), 10), r"'source_row' is reserved"),
        (("id", "y", (), 10), r"at least one feature column"),
        (("id", "y", ("x",), 1), r"n_classes must be an integer of at least 2"),
    ],
)
def test_table_schema_is_validated(columns, message):
    with pytest.raises(InputError, match=message):
        TableSchema(*columns)


def test_data_version_ignores_provenance_and_time_but_not_content(prepared):
    manifest, _ = prepared

    elsewhere = dataclasses.replace(manifest, raw_files=(), previous_version="dv-0", created_at="2000-01-01")
    part = manifest.parts[-1]
    changed_split = dataclasses.replace(part.splits[2], dead="x.npy", dead_sha256="0" * 64, dead_rows=1)
    changed_part = dataclasses.replace(part, splits=(*part.splits[:2], changed_split))
    changed = dataclasses.replace(manifest, parts=(*manifest.parts[:-1], changed_part))
    assert elsewhere.data_version == manifest.data_version
    assert changed.data_version != manifest.data_version


def test_an_edited_manifest_is_not_trusted(prepared):
    manifest, _ = prepared
    document = json.loads(manifest.to_json())
    document["parts"][0]["splits"]["test"]["shard"]["inputs_sha256"] = "0" * 64

    with pytest.raises(InputError, match=r"manifest was edited"):
        Manifest.from_json(json.dumps(document))


def test_reading_a_split_starts_no_arrow_thread_that_could_outlive_the_interpreter(prepared_data):
    """A split is read on the calling thread: no Arrow worker thread exists to drop the last reference to its
    Python buffer during interpreter exit, which aborted a finished process (exit -6). Counted in a fresh
    interpreter, whose thread pools nothing else has started."""
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from training.tasks.tabular.manifest import read_manifest, read_split_table\n"
        "def threads(): return len(os.listdir('/proc/self/task'))\n"
        "folder = Path(sys.argv[1])\n"
        "manifest = read_manifest(folder)\n"
        "before = threads()\n"
        "splits = [read_split_table(folder, manifest, name) for name in ('train', 'validation', 'test')]\n"
        "rows = sum(split.num_rows for split in splits)\n"
        "print(before, threads(), rows)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(prepared_data)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    before, after, rows = map(int, result.stdout.split())
    assert rows > 0
    assert after == before, f"reading the splits started {after - before} thread(s)"
