from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.training.filling_disk import can_mount, tmpfs

from core.errors import InputError
from training.cli import main
from training.data.splits import SPLIT_NAMES, SplitFractions, assign_splits, split_position
from training.tasks.tabular.dataset import load_prepared
from training.tasks.tabular.manifest import Manifest, read_manifest, read_split_table
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.sample_data import write_sample_batches
from training.tasks.tabular.schema import DIGITS_SCHEMA, TableSchema
from training.tasks.tabular.task import DIGITS_OPTIONS

HEADER = list(DIGITS_SCHEMA.columns)
# The digits' configuration, as a model's configuration file would give it: the columns and classes pinned.
DIGITS = ["--task-options", json.dumps(DIGITS_OPTIONS)]


def synthetic_row(index: int, label: int | None = None) -> list[str]:
    pixels = [str((index * 7 + column) % 17) for column in range(len(DIGITS_SCHEMA.feature_columns))]
    return [f"key-{index:04d}", str(index % 10 if label is None else label), *pixels]


def write_csv(path: Path, rows: list[list[str]], header: list[str] = HEADER) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def split_tables(prepared: Path) -> dict[str, pa.Table]:
    manifest = read_manifest(prepared)
    return {name: read_split_table(prepared, manifest, name) for name in SPLIT_NAMES}


def key_to_split(prepared: Path) -> dict[str, str]:
    return {
        key: name for name, table in split_tables(prepared).items() for key in table["row_key"].to_pylist()
    }


def manifest_content(manifest: Manifest) -> dict:
    """Everything but the fields that say when and from what earlier version it was made."""
    document = json.loads(manifest.to_json())
    return {key: value for key, value in document.items() if key not in ("created_at", "previous_version")}


def test_prepare_writes_a_part_per_raw_chunk_and_a_manifest(prepared, sample_raw):
    manifest, out = prepared

    assert [part.raw_file for part in manifest.parts] == sorted(path.name for path in sample_raw.iterdir())
    expected = {"manifest.json"}
    for part in manifest.parts:
        expected |= set(part.files())
        expected |= {entry.dead for entry in part.splits if entry.dead is not None}
        for name, digest in part.files().items():
            assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    assert {path.name for path in out.iterdir()} == expected
    assert re.fullmatch(r"dv-[0-9a-f]{16}", manifest.data_version)
    assert Manifest.from_json((out / "manifest.json").read_text()) == manifest
    tables = split_tables(out)
    for name, table in tables.items():
        assert manifest.split_rows(name) == table.num_rows
        assert {"source_file", "source_row"} <= set(table.column_names)
    assert sum(table.num_rows for table in tables.values()) == 1797
    assert tables["train"].num_rows == pytest.approx(0.8 * 1797, rel=0.05)
    assert tables["test"].num_rows == pytest.approx(0.1 * 1797, rel=0.25)
    assert [(entry.name, entry.sha256) for entry in manifest.raw_files] == [
        (path.name, hashlib.sha256(path.read_bytes()).hexdigest()) for path in sorted(sample_raw.iterdir())
    ]


def test_overlapping_batches_count_as_exact_duplicates(prepared):
    manifest, _ = prepared

    stats = manifest.stats
    assert (stats.raw_rows, stats.unique_rows, stats.exact_duplicates, stats.superseded) == (
        1812,
        1797,
        15,
        0,
    )


def test_normalization_is_the_train_split_mean_and_std(prepared):
    manifest, out = prepared

    train = split_tables(out)["train"]
    features = np.column_stack([train[name].to_numpy() for name in DIGITS_SCHEMA.feature_columns])
    features = features.astype(np.float32).astype(np.float64)  # the values training sees
    np.testing.assert_allclose(manifest.normalization.mean, features.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(manifest.normalization.std, features.std(axis=0), rtol=1e-9, atol=1e-9)


def test_each_row_lands_in_the_split_its_key_hashes_to(prepared):
    _, out = prepared

    for name, table in split_tables(out).items():
        keys = table["row_key"].to_pylist()
        assert {SPLIT_NAMES[index] for index in assign_splits(keys, SplitFractions())} == {name}


def test_same_rows_in_the_same_batches_give_the_same_version_whatever_the_format(prepared, tmp_path):
    manifest, out = prepared
    write_sample_batches(tmp_path / "raw", batches=4, file_format="parquet")  # as `prepared`'s, in Parquet
    write_sample_batches(tmp_path / "rebatched", batches=7, file_format="csv")

    other = prepare(tmp_path / "raw", tmp_path / "out")
    rebatched = prepare(tmp_path / "rebatched", tmp_path / "out-rebatched")

    assert other.data_version == manifest.data_version
    assert other.raw_files != manifest.raw_files
    assert split_tables(tmp_path / "out")["test"]["row_key"].equals(split_tables(out)["test"]["row_key"])
    # A version is its parts: other batches are other parts, so another version of the same rows.
    assert rebatched.data_version != manifest.data_version
    assert set(split_tables(tmp_path / "out-rebatched")["test"]["row_key"].to_pylist()) == set(
        split_tables(out)["test"]["row_key"].to_pylist()
    )


def test_other_split_fractions_give_another_version(prepared, sample_raw, tmp_path):
    manifest, _ = prepared

    other = prepare(sample_raw, tmp_path / "out", split=SplitFractions(0.6, 0.2, 0.2))

    assert other.data_version != manifest.data_version
    assert other.split_rows("train") == pytest.approx(0.6 * 1797, rel=0.06)


def test_rows_never_change_split_as_data_grows(sample_raw, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    batches = sorted(sample_raw.iterdir())
    for path in batches[:2]:
        shutil.copy(path, raw)
    prepare(raw, tmp_path / "small")
    for path in batches[2:]:
        shutil.copy(path, raw)
    prepare(raw, tmp_path / "large")

    small, large = key_to_split(tmp_path / "small"), key_to_split(tmp_path / "large")
    assert len(large) > len(small) > 0
    assert {key: large[key] for key in small} == small


def test_later_files_and_later_rows_supersede_earlier_versions_of_a_key(tmp_path):
    raw = tmp_path / "raw"
    write_csv(raw / "batch-0001.csv", [synthetic_row(index, label=0) for index in range(100)])
    write_csv(
        raw / "batch-0002.csv",
        [
            synthetic_row(5, label=7),
            synthetic_row(6, label=0),
            synthetic_row(7, label=3),
            synthetic_row(7, label=4),
        ],
    )

    manifest = prepare(raw, tmp_path / "out")

    rows = pa.concat_tables(split_tables(tmp_path / "out").values()).to_pylist()
    kept = {row["row_key"]: row for row in rows}
    assert len(rows) == len(kept) == 100
    assert (kept["key-0005"]["label"], kept["key-0005"]["source_file"]) == (7, "batch-0002.csv")
    assert (kept["key-0006"]["source_file"], kept["key-0006"]["source_row"]) == ("batch-0002.csv", 2)
    assert (kept["key-0007"]["label"], kept["key-0007"]["source_row"]) == (4, 4)
    assert kept["key-0008"]["source_file"] == "batch-0001.csv"
    # key-0005: 0 -> 7; key-0007: 0 -> 3 -> 4 are changes; key-0006 is re-delivered unchanged.
    assert (manifest.stats.exact_duplicates, manifest.stats.superseded) == (1, 3)


def test_incremental_preparation_equals_a_full_one(sample_raw, tmp_path, caplog):
    raw = tmp_path / "raw"
    raw.mkdir()
    batches = sorted(sample_raw.iterdir())
    for path in batches[:3]:
        shutil.copy(path, raw)
    first = prepare(raw, tmp_path / "v1")
    shutil.copy(batches[3], raw)
    correction = synthetic_row(0, label=9)
    correction[0] = "digits-0003"  # a key from the first batch, now with another label and pixels
    write_csv(raw / "batch-0005.csv", [correction])

    caplog.set_level(logging.INFO, logger="training.tasks.tabular.prepare")
    incremental = prepare(raw, tmp_path / "v2", previous=tmp_path / "v1")
    full = prepare(raw, tmp_path / "full")

    assert "reading 2 new raw files" in caplog.text
    assert incremental.previous_version == first.data_version
    assert incremental.data_version == full.data_version != first.data_version
    assert manifest_content(incremental) == manifest_content(full)
    assert incremental.stats.superseded == 1
    for name, table in split_tables(tmp_path / "v2").items():
        assert table.equals(split_tables(tmp_path / "full")[name])
    rows = pa.concat_tables(split_tables(tmp_path / "v2").values()).to_pylist()
    assert [row["label"] for row in rows if row["row_key"] == "digits-0003"] == [9]


@pytest.mark.parametrize("change", ["edit", "remove", "late-name"])
def test_incremental_falls_back_to_a_full_preparation_when_seen_files_changed(
    sample_raw, tmp_path, caplog, change
):
    raw = tmp_path / "raw"
    raw.mkdir()
    batches = sorted(sample_raw.iterdir())
    for path in batches[:2]:
        shutil.copy(path, raw)
    prepare(raw, tmp_path / "v1")
    shutil.copy(batches[2], raw)
    if change == "edit":
        write_csv(raw / "batch-0001.csv", [synthetic_row(index) for index in range(300)])
    elif change == "remove":
        (raw / "batch-0001.csv").unlink()
    else:
        shutil.copy(batches[3], raw / "batch-0000.csv")

    caplog.set_level(logging.INFO, logger="training.tasks.tabular.prepare")
    incremental = prepare(raw, tmp_path / "v2", previous=tmp_path / "v1")

    reason = {"edit": "batch-0001.csv has changed", "remove": "batch-0001.csv that it saw has been removed",
              "late-name": "batch-0000.csv sorts before batch-0002.csv"}[change]  # fmt: skip
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert reason in warnings[0]
    assert manifest_content(incremental) == manifest_content(prepare(raw, tmp_path / "full"))


@pytest.mark.parametrize("previous", ["gone", "not-a-version", "another-tasks"])
def test_a_previous_version_that_does_not_read_costs_the_increment_never_the_preparation(
    sample_raw, tmp_path, caplog, previous
):
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(sorted(sample_raw.iterdir())[0], raw)
    folder = tmp_path / "previous"
    if previous != "gone":  # a deleted cache entry or job output
        folder.mkdir()
    if previous == "another-tasks":  # the image task's manifest: another format
        (folder / "manifest.json").write_text(json.dumps({"format": "retrain-images/1", "data_version": "x"}))

    caplog.set_level(logging.WARNING, logger="training.tasks.tabular.prepare")
    built = prepare(raw, tmp_path / "v1", previous=folder)

    [warning] = [record.getMessage() for record in caplog.records]
    assert warning.startswith(f"not building on {folder}: ") and warning.endswith("; preparing all raw files")
    assert "\n" not in warning
    assert built.previous_version is None
    assert manifest_content(built) == manifest_content(prepare(raw, tmp_path / "full"))


def test_existing_empty_output_folder_is_filled(sample_raw, tmp_path, prepared):
    (tmp_path / "mount").mkdir()

    manifest = prepare(sample_raw, tmp_path / "mount")

    assert manifest.data_version == prepared[0].data_version
    assert sorted(path.name for path in (tmp_path / "mount").iterdir()) == sorted(
        path.name for path in prepared[1].iterdir()
    )


def test_output_holding_the_same_version_is_left_as_it_is(prepared, sample_raw):
    manifest, out = prepared
    before = {path.name: path.stat().st_mtime_ns for path in out.iterdir()}

    again = prepare(sample_raw, out)

    assert again == manifest
    assert {path.name: path.stat().st_mtime_ns for path in out.iterdir()} == before


def test_output_holding_another_version_is_refused(prepared, sample_raw, tmp_path):
    _, out = prepared
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(sorted(sample_raw.iterdir())[0], raw)

    with pytest.raises(InputError, match=r"already holds data version dv-\w+, not dv-\w+"):
        prepare(raw, out)


def test_output_holding_other_files_is_refused_and_kept(sample_raw, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")

    with pytest.raises(InputError, match=r"the output folder is not empty"):
        prepare(sample_raw, tmp_path / "out")

    assert [path.name for path in (tmp_path / "out").iterdir()] == ["notes.txt"]


def test_unwritable_output_leaves_nothing_behind(sample_raw, tmp_path):
    (tmp_path / "a-file").write_text("")

    with pytest.raises(InputError, match=r"cannot create"):
        prepare(sample_raw, tmp_path / "a-file" / "sub" / "out")

    assert [path.name for path in tmp_path.iterdir()] == ["a-file"]


def _bad_value(raw: Path) -> None:
    # One file: a bad file among good ones is left out and the rest prepared (test_prepare_rejects.py).
    write_sample_batches(raw, batches=1)
    path = raw / "batch-0001.csv"
    rows = list(csv.reader(path.open()))
    rows[17][HEADER.index("pixel_5")] = "abc"
    write_csv(path, rows[1:], header=rows[0])


def _cells(*changes: tuple[int, str, str], rows: int = 5) -> Callable[[Path], None]:
    """A raw folder with one synthetic CSV whose (row, column) cells are replaced by the given values."""

    def setup(raw: Path) -> None:
        table = [synthetic_row(index) for index in range(rows)]
        for row, column, value in changes:
            table[row - 1][HEADER.index(column)] = value
        write_csv(raw / "batch-0001.csv", table)

    return setup


def _parquet_with_null_label(raw: Path) -> None:
    # A missing feature is a missing value (test_tabular_columns.py); a missing label is refused.
    columns: dict[str, list] = {"row_key": ["a", "b", "c"], "label": [1, None, 3]}
    for name in DIGITS_SCHEMA.feature_columns:
        columns[name] = [1.0, 1.0, 2.0]
    raw.mkdir(parents=True)
    pq.write_table(pa.table(columns), raw / "batch-0001.parquet")


def _write_bytes(name: str, data: bytes) -> Callable[[Path], None]:
    def setup(raw: Path) -> None:
        raw.mkdir(parents=True)
        (raw / name).write_bytes(data)

    return setup


def _header(header: list[str]) -> Callable[[Path], None]:
    return lambda raw: write_csv(raw / "batch-0001.csv", [], header=header)


FINITE = (
    "a finite number within float32's range (|x| <= 3.4e38) or a blank (if the column holds names, declare "
    'it in the task option column_types as "categorical")'
)

# fmt: off
BAD_INPUTS = {
    "missing folder": (lambda raw: None, "raw: the raw data folder does not exist"),
    "no raw files": (_write_bytes("notes.txt", b"hi"), "raw: holds no raw files; expected a folder of .csv"),
    "empty file": (_write_bytes("batch-0001.csv", b""), "batch-0001.csv: the file is empty (0 bytes)"),
    "not parquet": (
        _write_bytes("batch-0001.parquet", b"PAR1"),
        "batch-0001.parquet: not a readable Parquet",
    ),
    "ragged csv": (
        _write_bytes("batch-0001.csv", b"row_key,label\na,1\nb\n"),
        "batch-0001.csv: not a readable CSV file (CSV parse error: Row #3: Expected 2 columns, got 1",
    ),
    "missing column": (
        _header([name for name in HEADER if name != "pixel_5"]),
        "batch-0001.csv: missing column 'pixel_5'; expected the columns row_key, label, pixel_0..pixel_63",
    ),
    "unexpected column": (_header([*HEADER, "colour"]), "batch-0001.csv: unexpected column 'colour'"),
    "non-numeric": (
        _bad_value, f"batch-0001.csv: data row 17, column 'pixel_5': expected {FINITE}, got 'abc'",
    ),
    "infinite": (
        _cells((2, "pixel_0", "inf")),
        f"row 2, column 'pixel_0': expected {FINITE}, got 'inf'",
    ),
    "first bad row wins": (
        _cells((4, "pixel_9", "x"), (2, "pixel_60", "y")),
        f"batch-0001.csv: data row 2, column 'pixel_60': expected {FINITE}, got 'y'",
    ),
    "label range": (
        _cells((3, "label", "10")),
        "row 3, column 'label': expected an integer class in [0, 10), got '10'",
    ),
    "label not integer": (_cells((1, "label", "2.5")), "row 1, column 'label': expected an integer class"),
    "blank key": (
        _cells((5, "row_key", " ")),
        "row 5, column 'row_key': expected a non-empty string, got ' '",
    ),
    "null label in parquet": (
        _parquet_with_null_label,
        "batch-0001.parquet: data row 2, column 'label': expected an integer class in [0, 10), got an empty "
        "value",
    ),
    "no rows": (_header(HEADER), "raw: its 1 raw file(s) hold no data rows"),
    "too few rows": (_cells(rows=3), "raw: too few rows: 3 unique rows leave the"),
}
# fmt: on


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_with_one_line_and_writes_nothing(tmp_path, capsys, case):
    setup, expected = BAD_INPUTS[case]
    setup(tmp_path / "raw")
    capsys.readouterr()

    code = main(["prepare", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "out"), *DIGITS])

    lines = capsys.readouterr().err.splitlines()
    assert code != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("retrain: error: ")
    assert expected in lines[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == (["raw"] if case != "missing folder" else [])


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (_header([*HEADER, "colour"]), "raw: its 1 raw file(s) hold no data rows"),  # colour is a feature
        (_cells((2, "label", "-1")), "row 2, column 'label': expected an integer class of 0 or more"),
        (_header(["row_key", "label"]), "the raw files have no columns besides row_key, label"),
        (_write_bytes("batch-0001.parquet", b"PAR1"), "batch-0001.parquet: not a readable Parquet file"),
    ],
)
def test_default_options_take_every_other_column_as_a_feature_and_any_class_count(
    tmp_path, capsys, setup, expected
):
    setup(tmp_path / "raw")

    assert main(["prepare", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "out")]) != 0

    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_input_leaves_an_existing_empty_output_folder_empty(tmp_path, capsys):
    _cells((1, "pixel_1", "?"))(tmp_path / "raw")
    (tmp_path / "out").mkdir()

    assert main(["prepare", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "out")]) != 0

    assert list((tmp_path / "out").iterdir()) == []
    assert "row 1, column 'pixel_1'" in capsys.readouterr().err


def test_cli_accepts_split_fractions(sample_raw, tmp_path):
    code = main(
        ["prepare", "--raw", str(sample_raw), "--out", str(tmp_path / "out"), "--split", "0.5,0.25,0.25"]
    )

    assert code == 0

    manifest = Manifest.from_json((tmp_path / "out" / "manifest.json").read_text())
    assert manifest.split == SplitFractions(0.5, 0.25, 0.25)


def test_cli_rejects_split_fractions_that_do_not_add_up(sample_raw, tmp_path, capsys):
    code = main(
        ["prepare", "--raw", str(sample_raw), "--out", str(tmp_path / "out"), "--split", "0.8,0.1,0.2"]
    )

    lines = capsys.readouterr().err.splitlines()
    assert code != 0
    assert lines == [lines[0]]
    assert "add up to 1.1; change them so they add up to 1" in lines[0]
    assert not (tmp_path / "out").exists()


def test_split_positions_are_uniform_and_stable():
    keys = [f"row-{index}" for index in range(20_000)]
    positions = np.array([split_position(key) for key in keys])

    assert ((positions >= 0) & (positions < 1)).all()
    assert np.histogram(positions, bins=10, range=(0, 1))[0] == pytest.approx([2000] * 10, rel=0.1)
    assert split_position("digits-0001") == split_position("digits-0001") != split_position("digits-0002")


NO_VERSION_TASK = """
from training.tasks.tabular.task import TabularTask


class NoVersion(TabularTask):
    def prepare(self, raw, out, *, previous, split):
        super().prepare(raw, out, previous=previous, split=split)  # writes the data, forgets to say which
"""


def test_a_prepare_that_returns_no_version_fails_the_step_in_one_line(tmp_path, sample_raw, capsys):
    (tmp_path / "no_version.py").write_text(NO_VERSION_TASK)
    task = f"{tmp_path / 'no_version.py'}:NoVersion"
    capsys.readouterr()

    out = tmp_path / "out"
    code = main(["prepare", "--task", task, "--raw", str(sample_raw), "--out", str(out), *DIGITS])

    assert code != 0  # a failed step: the runner caches no output of it
    assert capsys.readouterr().err.splitlines() == [
        f"retrain: error: --task {task!r}: prepare returned None and left {tmp_path / 'out'} a folder; "
        "expected the data version it wrote into that folder (text, e.g. 'dv-0123456789abcdef')"
    ]


def _deliveries(seed: int, files: int, rows: int, keys: int) -> list[list[list]]:
    """Raw batches whose keys recur across and within files, some deliveries repeating a row exactly."""
    rng = np.random.default_rng(seed)
    batches, last = [], {}
    for _ in range(files):
        batch = []
        for key in rng.integers(0, keys, rows):
            name = f"k{key:05d}"
            if name in last and rng.random() < 0.3:
                row = list(last[name])  # the same row again: an exact duplicate
            else:
                row = [name, int(rng.integers(0, 3)), *np.round(rng.normal(size=4), 3).tolist()]
            last[name] = row
            batch.append(row)
        batches.append(batch)
    return batches


def _write_batches(raw: Path, batches: list[list[list]], first: int = 0) -> None:
    for number, rows in enumerate(batches, start=first):
        write_csv(raw / f"batch-{number:04d}.csv", rows, header=["id", "y", "a", "b", "c", "d"])


def test_parts_chain_to_the_full_preparation_and_to_last_delivery_wins(tmp_path):
    """Small parts (40 rows) so files span several parts and keys are superseded across parts and files:
    versions built each on the one before give the full preparation's files, byte for byte, share every
    file of the version before, and hold exactly what "last delivery wins" gives, counted as it counts."""
    schema = TableSchema(key_column="id", label_column="y", feature_columns=None, n_classes=None)
    batches = _deliveries(seed=7, files=6, rows=150, keys=300)
    raw = tmp_path / "raw"
    raw.mkdir()
    previous = None
    for step, (start, stop) in enumerate([(0, 3), (3, 5), (5, 6)]):
        _write_batches(raw, batches[start:stop], first=start)
        out = tmp_path / f"v{step}"
        prepare(raw, out, previous=previous, schema=schema, rows_per_part=40)
        if previous is not None:
            shared = {
                path.name: path.stat().st_ino for path in previous.iterdir() if path.name.endswith("keys.npy")
            }
            assert shared and all((out / name).stat().st_ino == inode for name, inode in shared.items())
        previous = out
    full = prepare(raw, tmp_path / "full", schema=schema, rows_per_part=40)

    chained = read_manifest(previous)
    assert chained.data_version == full.data_version
    assert manifest_content(chained) == manifest_content(full)
    names = sorted(path.name for path in (tmp_path / "full").iterdir())
    assert names == sorted(path.name for path in previous.iterdir())
    for name in names:  # the manifests differ only in when and from what: compared above
        if name != "manifest.json":
            assert (previous / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name

    winners, exact, superseded = {}, 0, 0
    for row in (row for batch in batches for row in batch):
        if row[0] in winners:
            same = winners[row[0]] == row
            exact, superseded = exact + same, superseded + (not same)
        winners[row[0]] = row
    live = pa.concat_tables(split_tables(previous).values()).to_pylist()
    assert {
        row["id"]: [row["id"], row["y"], row["a"], row["b"], row["c"], row["d"]] for row in live
    } == winners
    assert len(live) == len(winners)
    assert (full.stats.unique_rows, full.stats.exact_duplicates, full.stats.superseded) == (
        len(winners),
        exact,
        superseded,
    )
    data = load_prepared(previous)
    assert sum(len(data.split(name)) for name in SPLIT_NAMES) == len(winners)
    train = split_tables(previous)["train"]
    values = (
        np.column_stack([train[name].to_numpy() for name in "abcd"]).astype(np.float32).astype(np.float64)
    )
    np.testing.assert_allclose(full.normalization.mean, values.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(full.normalization.std, values.std(axis=0), rtol=1e-9, atol=1e-12)


_LIMITED_PREPARE = """
import resource, signal, sys
from pathlib import Path
from core.errors import InputError
from training.tasks.tabular.prepare import prepare
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    prepare(Path(sys.argv[1]), Path(sys.argv[2]))
except InputError as error:
    print(error)
"""


def test_a_disk_without_room_fails_prepare_in_one_line_and_leaves_nothing(sample_raw, tmp_path):
    disk = tmp_path / "disk"
    if can_mount():  # a real disk of 256 KiB, which the version (about 1 MB) does not fit
        with tmpfs(disk, "size=256k"):
            with pytest.raises(InputError) as raised:
                prepare(sample_raw, disk / "v1")
            line = str(raised.value)
            left = os.listdir(disk)
    else:  # no small disk to be had: a file size limit makes the kernel refuse the writes alike
        disk.mkdir()
        line = subprocess.run(
            [sys.executable, "-c", _LIMITED_PREPARE, str(sample_raw), str(disk / "v1")],
            capture_output=True, text=True, check=True, timeout=120, cwd=Path(__file__).resolve().parents[3],
        ).stdout.strip()  # fmt: skip
        left = os.listdir(disk)

    assert "\n" not in line
    assert line.startswith(f"{disk / 'v1'}: cannot write the prepared data (")
    assert line.endswith("expected a writable folder with room for the data version")
    assert left == []  # no version, no parts, no staging
