"""A raw file that does not fit costs that file, never the data version (issue 41, item 5): prepare leaves
it out, names it in one warning line and in its `--rejected` report (core/rejected_inputs.py), and prepares
the rest, exactly as if the file had never landed. An open schema comes from the previous version, else
from most of the data: never from whichever file sorts first. An image that cannot be decoded costs itself
too, and a user's task leaves a file out the same way.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from core.rejected_inputs import RejectedFile, read_report
from training.cli import main
from training.tasks.image.manifest import read_manifest as read_image_manifest
from training.tasks.image.sample_data import write_sample_images
from training.tasks.tabular.manifest import read_manifest
from training.tasks.tabular.sample_data import write_sample_batches

FINITE = (
    "a finite number within float32's range (|x| <= 3.4e38) or a blank (if the column holds names, declare "
    'it in the task option column_types as "categorical")'
)
NARROW = "missing columns 'pixel_1', 'pixel_2', 'pixel_3', 'pixel_4', 'pixel_5' and 58 more; expected the "
NARROW += "columns row_key, label, pixel_0..pixel_63 (any order)"


def _prepare(raw: Path, out: Path, *options: str) -> int:
    return main(["prepare", "--raw", str(raw), "--out", str(out), "--rejected", f"{out}-rejected", *options])


def _with_bad_cell(path: Path) -> None:
    lines = path.read_text().splitlines()
    cells = lines[17].split(",")
    cells[7] = "abc"  # data row 17, column pixel_5
    lines[17] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def _narrow(path: Path, rows: int) -> None:
    """A batch of another schema: one feature column where the model has 64."""
    path.write_text("row_key,label,pixel_0\n" + "".join(f"n-{i},{i % 10},{i % 16}\n" for i in range(rows)))


def test_files_that_do_not_fit_are_left_out_each_named_once_and_the_rest_prepared(tmp_path, caplog):
    good = tmp_path / "good"
    write_sample_batches(good, batches=3)
    raw = tmp_path / "raw"
    shutil.copytree(good, raw)
    _narrow(raw / "bad.csv", rows=0)  # sorts first: it decides nothing
    shutil.copy(good / "batch-0003.csv", raw / "batch-0004.csv")
    _with_bad_cell(raw / "batch-0004.csv")
    caplog.set_level(logging.WARNING)

    assert _prepare(raw, tmp_path / "out") == 0

    assert read_report(tmp_path / "out-rejected") == (
        RejectedFile("bad.csv", NARROW),
        RejectedFile("batch-0004.csv", f"data row 17, column 'pixel_5': expected {FINITE}, got 'abc'"),
    )
    lines = [record.getMessage() for record in caplog.records if record.name == "training.data.rejection"]
    assert lines == [
        f"left out raw file bad.csv: {NARROW}",
        f"left out raw file batch-0004.csv: data row 17, column 'pixel_5': expected {FINITE}, got 'abc'",
    ]
    # What was prepared is what the good files alone make: the bad ones left no trace in it.
    assert _prepare(good, tmp_path / "alone") == 0
    assert read_report(tmp_path / "alone-rejected") == ()
    prepared, alone = read_manifest(tmp_path / "out"), read_manifest(tmp_path / "alone")
    assert prepared.data_version == alone.data_version
    assert [entry.name for entry in prepared.raw_files] == [
        "batch-0001.csv",
        "batch-0002.csv",
        "batch-0003.csv",
    ]
    # The raw folder itself is left as it was.
    assert sorted(path.name for path in raw.iterdir()) == [
        "bad.csv",
        *(f"batch-000{n}.csv" for n in range(1, 5)),
    ]


def test_an_open_schema_is_the_previous_versions_else_that_of_most_of_the_data(tmp_path):
    first = tmp_path / "first"
    write_sample_batches(first, batches=1)
    assert _prepare(first, tmp_path / "v1") == 0
    raw = tmp_path / "raw"
    shutil.copytree(first, raw)
    _narrow(raw / "a-narrow.csv", rows=40_000)  # more bytes than the digits batch, and it sorts first
    assert (raw / "a-narrow.csv").stat().st_size > (raw / "batch-0001.csv").stat().st_size

    # The model's last good version fixes the columns: the narrow file is the one that does not fit.
    assert _prepare(raw, tmp_path / "v2", "--previous", str(tmp_path / "v1")) == 0
    assert read_report(tmp_path / "v2-rejected") == (RejectedFile("a-narrow.csv", NARROW),)
    assert read_manifest(tmp_path / "v2").schema == read_manifest(tmp_path / "v1").schema

    # With no version to follow, the columns are those of most of the data, and the other file is named.
    assert _prepare(raw, tmp_path / "first-version") == 0
    [left_out] = read_report(tmp_path / "first-version-rejected")
    assert left_out.name == "batch-0001.csv"
    assert left_out.reason.startswith("unexpected columns 'pixel_1', 'pixel_2'")
    assert read_manifest(tmp_path / "first-version").schema.feature_columns == ("pixel_0",)


PICKY_TASK = """
from training.errors import RawFilesRejected, RejectedFile
from training.tasks.tabular.task import TabularTask


class Picky(TabularTask):
    def prepare(self, raw, out, *, previous, split):
        skipped = sorted(path.name for path in raw.iterdir() if path.name.startswith("skip-"))
        if skipped:
            why = "this task skips it; expected no skip- prefix"
            raise RawFilesRejected([RejectedFile(name, why) for name in skipped])
        return super().prepare(raw, out, previous=previous, split=split)
"""


def test_a_users_task_leaves_a_file_out_by_raising_raw_files_rejected(tmp_path):
    raw = tmp_path / "raw"
    write_sample_batches(raw, batches=2)
    shutil.copy(raw / "batch-0002.csv", raw / "skip-0003.csv")
    (tmp_path / "picky.py").write_text(PICKY_TASK)

    assert _prepare(raw, tmp_path / "out", "--task", f"{tmp_path / 'picky.py'}:Picky") == 0

    expected = RejectedFile("skip-0003.csv", "this task skips it; expected no skip- prefix")
    assert read_report(tmp_path / "out-rejected") == (expected,)
    assert [entry.name for entry in read_manifest(tmp_path / "out").raw_files] == [
        "batch-0001.csv", "batch-0002.csv",
    ]  # fmt: skip


def test_an_image_that_cannot_be_decoded_is_left_out_and_the_others_prepared(tmp_path):
    raw = tmp_path / "raw"
    write_sample_images(raw, per_class=10, seed=0)
    corrupt = sorted((raw / "circle").iterdir())[3]
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n not an image")

    assert _prepare(raw, tmp_path / "out", "--task", "image") == 0

    [left_out] = read_report(tmp_path / "out-rejected")
    assert left_out.name == f"circle/{corrupt.name}"
    assert (
        left_out.reason.startswith("not a readable image (")
        and "expected a PNG or JPEG image" in left_out.reason
    )
    assert read_image_manifest(tmp_path / "out").stats.images == 39
