"""The tabular task behind the task contract: its options describe any numeric CSV, not only the digits."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.training.iris import IRIS_COLUMNS, SPECIES, iris_task, write_iris

from core.errors import InputError
from training.data.splits import SplitFractions
from training.gate.pyfunc_model import serving_signature
from training.tasks.base import missing_parts
from training.tasks.loader import load_task
from training.tasks.tabular.manifest import read_manifest
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.schema import DERIVED_KEY_COLUMN, DIGITS_SCHEMA
from training.tasks.tabular.task import DIGITS_OPTIONS, TabularTask


def test_the_builtin_is_a_complete_task_with_directed_metrics():
    task = load_task("tabular")

    assert missing_parts(task) == []
    assert task.metrics.direction("loss") == "lower"
    assert task.metrics.direction("recall_3") == "higher"
    assert task.default_primary_metric == "macro_f1"
    assert task.raw_suffixes == (".csv", ".parquet")


def test_default_options_prepare_the_digits_sample_as_its_own_schema_does(sample_raw, prepared, tmp_path):
    manifest, _ = prepared  # prepared with DIGITS_SCHEMA itself

    task = load_task("tabular")

    version = task.prepare(sample_raw, tmp_path / "out", previous=None, split=SplitFractions())

    assert version == manifest.data_version
    assert read_manifest(tmp_path / "out").schema == DIGITS_SCHEMA
    assert TabularTask(**DIGITS_OPTIONS).schema.accepts(DIGITS_SCHEMA)


def test_an_iris_csv_with_text_classes_prepares_loads_and_serves(tmp_path):
    raw = write_iris(tmp_path / "raw")
    task = iris_task()

    version = task.prepare(raw, tmp_path / "prepared", previous=None, split=SplitFractions())
    data = task.load(tmp_path / "prepared")

    assert data.data_version == version
    assert data.info["feature_columns"] == IRIS_COLUMNS[:4]
    assert data.info["n_classes"] == 3
    assert data.info["classes"] == SPECIES
    inputs, targets = data.split("train")[torch.arange(len(data.split("train")))]
    assert inputs.dtype == torch.float32 and targets.dtype == torch.int64
    assert sum(len(data.split(name)) for name in ("train", "validation", "test")) == 149  # one exact repeat
    assert set(torch.unique(targets).tolist()) == {0, 1, 2}

    model = task.build_model(data.info).eval()
    answers = task.predict(model, data.info, pd.read_csv(raw / "iris.csv"))
    assert len(answers) == 150
    assert set(answers) <= set(SPECIES)


def test_integer_labels_need_no_class_names_and_the_class_count_comes_from_the_data(tmp_path):
    raw = write_iris(tmp_path / "raw", text_labels=False)
    task = load_task("tabular", {"label_column": "species", "key_column": None})

    task.prepare(raw, tmp_path / "prepared", previous=None, split=SplitFractions())
    data = task.load(tmp_path / "prepared")

    assert data.info["n_classes"] == 3
    assert data.info["classes"] is None
    answers = task.predict(task.build_model(data.info).eval(), data.info, pd.read_csv(raw / "iris.csv"))
    assert answers.dtype == np.int64


def test_names_and_indices_of_a_class_are_the_same_label(tmp_path):
    text = write_iris(tmp_path / "text", text_labels=True)
    numbers = write_iris(tmp_path / "numbers", text_labels=False)
    task = iris_task()

    from_text = task.prepare(text, tmp_path / "a", previous=None, split=SplitFractions())
    from_numbers = task.prepare(numbers, tmp_path / "b", previous=None, split=SplitFractions())

    assert from_text == from_numbers


def test_without_a_key_column_re_delivered_rows_are_exact_duplicates(tmp_path):
    raw = write_iris(tmp_path / "raw", name="batch-1.csv")
    write_iris(raw, name="batch-2.csv")  # the whole file delivered again

    task = iris_task()
    task.prepare(raw, tmp_path / "prepared", previous=None, split=SplitFractions())
    manifest = read_manifest(tmp_path / "prepared")

    assert manifest.stats.raw_rows == 300
    assert manifest.stats.unique_rows == 149
    assert manifest.stats.superseded == 0
    assert manifest.schema.key_field == DERIVED_KEY_COLUMN


def test_a_label_outside_the_named_classes_is_one_line_naming_row_and_column(tmp_path):
    raw = write_iris(tmp_path / "raw")
    lines = raw.joinpath("iris.csv").read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",daisy"
    raw.joinpath("iris.csv").write_text("\n".join(lines) + "\n")

    with pytest.raises(InputError, match=r"row 3, column 'species': expected one of the classes setosa"):
        iris_task().prepare(raw, tmp_path / "out", previous=None, split=SplitFractions())
    assert not (tmp_path / "out").exists()


def test_predict_names_missing_feature_columns_and_ignores_extra_ones(tmp_path):
    raw = write_iris(tmp_path / "raw")
    task = iris_task()
    task.prepare(raw, tmp_path / "prepared", previous=None, split=SplitFractions())
    data = task.load(tmp_path / "prepared")
    model = task.build_model(data.info).eval()
    frame = pd.read_csv(raw / "iris.csv").assign(notes="x")

    with pytest.raises(InputError, match=r"lacks feature column\(s\) sepal_length, petal_width"):
        task.predict(model, data.info, frame.drop(columns=["petal_width", "sepal_length"]))
    from_frame = task.predict(model, data.info, frame)
    from_array = task.predict(model, data.info, frame[IRIS_COLUMNS[:4]].to_numpy())
    assert list(from_frame) == list(from_array)


def test_loading_data_prepared_with_other_options_is_refused(tmp_path):
    raw = write_iris(tmp_path / "raw", text_labels=False)
    load_task("tabular", {"label_column": "species", "key_column": None}).prepare(
        raw, tmp_path / "prepared", previous=None, split=SplitFractions()
    )

    with pytest.raises(InputError, match=r"was prepared with classes None \(task option: \['setosa'"):
        iris_task().load(tmp_path / "prepared")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hidden_width": 0}, r"hidden_width 0: expected a positive integer"),
        ({"dropout": 1.5}, r"dropout 1.5: expected a probability in \[0, 1\)"),
        ({"classes": ["a", "b"], "n_classes": 3}, r"n_classes 3 but 2 classes are named"),
        ({"feature_columns": "x"}, r"feature_columns 'x': expected a list of names"),
        ({"n_classes": 1}, r"n_classes must be an integer of at least 2"),
        ({"colour": "red"}, r"unknown option\(s\) \['colour'\]"),
    ],
)
def test_bad_options_are_one_line_naming_the_option(options, message):
    with pytest.raises(InputError, match=message):
        load_task("tabular", options)


def test_options_are_json_ready_and_rebuild_the_same_task():
    task = iris_task()

    again = load_task("tabular", json.loads(json.dumps(task.options())))

    assert again.schema == task.schema
    assert again.options() == task.options()


def test_drift_features_are_the_feature_columns_of_deduplicated_raw_rows_or_the_train_split(tmp_path):
    raw = write_iris(tmp_path / "raw", name="batch-1.csv")
    write_iris(raw, name="batch-2.csv")
    task = iris_task()
    task.prepare(raw, tmp_path / "prepared", previous=None, split=SplitFractions())

    current = task.drift_features(raw, prepared=False)
    reference = task.drift_features(tmp_path / "prepared", prepared=True)

    assert current.names == reference.names == tuple(IRIS_COLUMNS[:4])
    assert len(current) == 149
    assert len(reference) == len(task.load(tmp_path / "prepared").split("train"))


def test_the_digits_schema_still_validates_labels_against_its_class_count(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    header = list(DIGITS_SCHEMA.columns)
    rows = [[f"k{index}", "10" if index == 2 else "1", *["0"] * 64] for index in range(40)]
    with (raw / "batch-0001.csv").open("w", newline="") as stream:
        csv.writer(stream).writerows([header, *rows])

    with pytest.raises(InputError, match=r"row 3, column 'label': expected an integer class in \[0, 10\)"):
        prepare(raw, tmp_path / "out", schema=TabularTask(**DIGITS_OPTIONS).schema)


def test_the_served_example_types_each_feature_as_the_whole_data_version_has_it(tmp_path):
    raw = write_iris(tmp_path / "raw")
    table = pd.read_csv(raw / "iris.csv")
    table["petals"] = np.arange(len(table)) % 7  # whole numbers in every row
    table["stems"] = np.arange(len(table)) % 3 + np.where(np.arange(len(table)) % 50 == 10, 0.5, 0.0)
    table.to_csv(raw / "iris.csv", index=False)  # stems: whole but in three rows
    task = iris_task()
    task.prepare(raw, tmp_path / "prepared", previous=None, split=SplitFractions())
    data = task.load(tmp_path / "prepared")

    example = task.input_example(data)

    assert data.info["whole_number_features"] == ["petals"]
    assert (example["stems"] == example["stems"].round()).all()  # the example's rows alone look whole
    assert example.dtypes.to_dict() == {**dict.fromkeys(IRIS_COLUMNS[:4], "float64"), "petals": "int64",
                                        "stems": "float64"}  # fmt: skip
    output = task.predict(task.build_model(data.info).eval(), data.info, example)
    inputs = serving_signature(example, output).inputs
    assert {spec.name: spec.type.name for spec in inputs.inputs} == {
        **dict.fromkeys(IRIS_COLUMNS[:4], "double"),
        "petals": "long",
        "stems": "double",
    }
    assert pd.read_csv(raw / "iris.csv")[["petals", "stems"]].dtypes.tolist() == ["int64", "float64"]
