"""The iris data set as a user's raw CSV (species as names or as integers), and the tabular task set up to
read it: a numeric CSV other than the digits."""

from __future__ import annotations

import csv
from pathlib import Path

from training.tasks.loader import load_task
from training.tasks.tabular.task import TabularTask

IRIS_COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width", "species"]
SPECIES = ["setosa", "versicolor", "virginica"]
IRIS_TEXT = {"label_column": "species", "key_column": None, "classes": SPECIES}


def write_iris(raw: Path, *, text_labels: bool = True, name: str = "iris.csv") -> Path:
    """`raw` with the iris data set as one raw CSV: four measurements and the species, as names or as
    integers."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    raw.mkdir(parents=True, exist_ok=True)
    path = raw / name
    with path.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(IRIS_COLUMNS)
        for features, target in zip(iris.data, iris.target, strict=True):
            writer.writerow([*features, SPECIES[target] if text_labels else int(target)])
    return raw


def iris_task(**options) -> TabularTask:
    return load_task("tabular", {**IRIS_TEXT, "hidden_width": 32, **options})
