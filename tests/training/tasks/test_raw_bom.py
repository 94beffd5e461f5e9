"""A CSV saved by Excel as "CSV UTF-8" starts with a byte order mark: it is the same table as without one
(issue 20, item 15)."""

from __future__ import annotations

from helpers.training.iris import IRIS_COLUMNS, iris_task, write_iris

from training.data.splits import SplitFractions
from training.tasks.tabular.raw_files import header_columns

BOM = b"\xef\xbb\xbf"


def test_a_csv_with_a_byte_order_mark_prepares_as_the_same_table(tmp_path):
    plain = write_iris(tmp_path / "plain")
    marked = write_iris(tmp_path / "marked")
    (marked / "iris.csv").write_bytes(BOM + (plain / "iris.csv").read_bytes())
    task = iris_task()

    assert header_columns(marked / "iris.csv") == IRIS_COLUMNS
    task.prepare(plain, tmp_path / "from-plain", previous=None, split=SplitFractions())
    task.prepare(marked, tmp_path / "from-marked", previous=None, split=SplitFractions())

    info = task.load(tmp_path / "from-marked").info
    assert info["feature_columns"] == IRIS_COLUMNS[:4]
    assert {key: info[key] for key in ("n_classes", "classes")} == {
        "n_classes": 3,
        "classes": ["setosa", "versicolor", "virginica"],
    }
    assert len(task.load(tmp_path / "from-marked").split("train")) == len(
        task.load(tmp_path / "from-plain").split("train")
    )
