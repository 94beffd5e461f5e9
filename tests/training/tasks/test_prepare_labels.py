"""A label outside the declared or inferred classes is refused at prep (issue 20, item 10): one line naming
the file, row, column, value and the expected range, before a class count of a billion reaches train."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.rejected_inputs import RejectedFile, read_report
from training.cli import main
from training.tasks.tabular.manifest import read_manifest
from training.tasks.tabular.prepare import inferred_class_count

HEADER = ["row_key", "label", "x0", "x1"]


def _write(raw: Path, name: str, labels: list[object]) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    rows = [f"{name}-{index},{label},{index % 7},{index % 5}" for index, label in enumerate(labels)]
    (raw / name).write_text("\n".join([",".join(HEADER), *rows]) + "\n")


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *options: str) -> str:
    capsys.readouterr()
    code = main(["prepare", "--raw", str(tmp_path / "raw"), "--out", str(tmp_path / "out"), *options])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert not (tmp_path / "out").exists()
    return lines[0]


BEYOND = (
    "data row 7, column 'label': expected an integer class in [0, 10), the range the other labels fill, got "
    "999999999; if the classes really go that far, declare them with the task option n_classes (or classes)"
)


def test_a_label_far_beyond_the_inferred_classes_is_refused_naming_its_row_and_range(tmp_path, capsys):
    raw = tmp_path / "raw"
    labels: list[object] = [index % 10 for index in range(40)]
    labels[6] = 999999999
    _write(raw, "batch-2.csv", labels)

    line = _refused(tmp_path, capsys)

    assert line == f"retrain: error: {raw / 'batch-2.csv'}: {BEYOND}"


def test_a_file_with_a_label_far_beyond_the_others_is_left_out_and_the_rest_prepared(tmp_path):
    raw = tmp_path / "raw"
    _write(raw, "batch-1.csv", [index % 10 for index in range(40)])
    labels: list[object] = [index % 10 for index in range(40)]
    labels[6] = 999999999
    _write(raw, "batch-2.csv", labels)

    code = main(
        ["prepare", "--raw", str(raw), "--out", str(tmp_path / "out"), "--rejected", str(tmp_path / "r")]
    )

    assert code == 0
    assert read_report(tmp_path / "r") == (RejectedFile("batch-2.csv", BEYOND),)
    manifest = read_manifest(tmp_path / "out")
    assert manifest.schema.n_classes == 10 and [file.name for file in manifest.raw_files] == ["batch-1.csv"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--task-option", "n_classes=10"], "expected an integer class in [0, 10), got '999999999'"),
        (
            ["--task-option", f"classes={[str(name) for name in range(10)]}".replace("'", '"')],
            "expected one of the classes 0, 1, 2, 3, 4, ... (or an index in [0, 10)), got '999999999'",
        ),
    ],
    ids=["n_classes", "classes"],
)
def test_a_label_outside_the_declared_classes_is_refused_naming_file_row_and_column(
    tmp_path, capsys, options, expected
):
    labels: list[object] = [index % 10 for index in range(40)]
    labels[3] = 999999999
    _write(tmp_path / "raw", "batch-1.csv", labels)

    line = _refused(tmp_path, capsys, *options)

    where = tmp_path / "raw" / "batch-1.csv"
    assert line == f"retrain: error: {where}: data row 4, column 'label': {expected}"


@pytest.mark.parametrize(
    ("labels", "count"),
    [
        ([0, 1], 2),
        (list(range(10)), 10),
        ([0, 2, 4, 6], 7),  # sparse, but filling half its range: every one a class
        ([1, 2, 3, 4, 5], 6),  # ratings from 1: class 0 unused
        ([*range(10), 999999999], 10),
        ([0, 1, 100], 2),
    ],
)
def test_the_inferred_class_count_is_the_range_the_labels_fill(labels, count):
    assert inferred_class_count(np.array(labels, dtype=np.int64)) == count
