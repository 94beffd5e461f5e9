"""The tabular task's column types, missing values and vocabularies, piece by piece (the end-to-end runs
are tests/components/local/test_tabular_tables.py): what the data decides and what the options declare, how a
category and a class name become codes that keep their meaning across versions, how serving reads what
a caller has, and the class weights."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.training.mixed_table import CITIES, FEATURES, mixed_table, write_batches

from core.errors import InputError
from training.data.splits import SplitFractions
from training.tasks.loader import load_task
from training.tasks.tabular.encoding import UNSEEN
from training.tasks.tabular.inputs import feature_array
from training.tasks.tabular.manifest import read_manifest

OPTIONS = {"label_column": "tier", "key_column": "id", "hidden_width": 16}


def _task(**options):
    return load_task("tabular", {**OPTIONS, **options})


def _prepare(task, raw, out, previous=None):
    task.prepare(raw, out, previous=previous, split=SplitFractions())
    return read_manifest(out)


def test_the_first_file_decides_each_undeclared_column_s_type_and_the_manifest_records_it(tmp_path):
    frame = mixed_table(400, 0).assign(
        postcode=lambda table: [f"0{number % 90 + 10}" for number in range(400)]
    )
    raw = write_batches(tmp_path / "raw", [frame], "tier")

    manifest = _prepare(_task(column_types={"postcode": "categorical"}), raw, tmp_path / "out")

    types = dict(zip(manifest.schema.feature_columns, manifest.schema.feature_types, strict=True))
    assert types == {
        "age": "numeric", "income": "numeric", "visits": "numeric", "colour": "categorical",
        "city": "categorical", "member": "boolean", "postcode": "categorical",
    }  # fmt: skip
    assert "010" in manifest.vocabularies["postcode"]  # a declared category keeps its text: no number
    assert manifest.schema.label_kind == "name"
    assert sorted(manifest.schema.classes) == ["bronze", "gold", "silver"]


def test_a_word_among_numbers_is_refused_naming_its_row_with_the_fix(tmp_path):
    frame = mixed_table(200, 0)
    frame.loc[6, "income"] = "n.a."  # not one of pandas' missing-value spellings
    raw = write_batches(tmp_path / "raw", [frame], "tier")

    with pytest.raises(InputError) as refused:
        _prepare(_task(), raw, tmp_path / "out")

    message = str(refused.value)
    assert "batch-0001.csv: data row 7, column 'income': expected a finite number" in message
    assert 'declare it in the task option column_types as "categorical"' in message
    assert message.endswith("got 'n.a.'")


def test_an_incremental_version_appends_categories_and_classes_and_equals_a_full_one(tmp_path):
    first = mixed_table(300, 1, cities=CITIES[:5])
    later = mixed_table(300, 2, first_id=300, cities=CITIES[3:8])
    later.loc[later.index[:3], "tier"] = "platinum"  # a class the first version never had
    task = _task()
    raw = write_batches(tmp_path / "raw", [first], "tier")
    v1 = _prepare(task, raw, tmp_path / "v1")
    write_batches(tmp_path / "raw", [first, later], "tier")

    v2 = _prepare(task, raw, tmp_path / "v2", previous=tmp_path / "v1")
    full = _prepare(task, raw, tmp_path / "full")

    assert v2.data_version == full.data_version != v1.data_version
    assert v2.vocabularies == full.vocabularies
    old, new = v1.vocabularies["city"], v2.vocabularies["city"]
    assert new[: len(old)] == old and set(new) == set(CITIES[:8])  # appended: old codes mean the same
    assert v2.schema.classes[: len(v1.schema.classes)] == v1.schema.classes
    assert v2.schema.classes[-1] == "platinum" and v2.schema.n_classes == 4
    assert {part.id for part in v1.parts} <= {part.id for part in v2.parts}  # v1's parts are shared


def test_categories_past_max_categories_share_the_unseen_code(tmp_path):
    raw = write_batches(tmp_path / "raw", [mixed_table(300, 0)], "tier")
    task = _task(max_categories=3)

    manifest = _prepare(task, raw, tmp_path / "out")
    data = task.load(tmp_path / "out")

    assert len(manifest.vocabularies["city"]) == 3
    inputs, _ = data.split("train")[torch.arange(len(data.split("train")))]
    city = inputs[:, list(manifest.schema.feature_columns).index("city")].numpy()
    assert set(np.unique(city[~np.isnan(city)])) <= {UNSEEN, 0.0, 1.0, 2.0}
    assert (city == UNSEEN).any()


def test_serving_reads_blanks_unseen_categories_and_booleans_as_callers_write_them(tmp_path):
    raw = write_batches(tmp_path / "raw", [mixed_table(300, 0)], "tier")
    task = _task()
    _prepare(task, raw, tmp_path / "out")
    info = task.load(tmp_path / "out").info
    caller = pd.DataFrame(
        {"age": [30, None, "41"], "income": [1.5, float("nan"), ""], "visits": [2, 3, 4],
         "colour": ["red", None, "mauve"], "city": [CITIES[0], "atlantis", ""],
         "member": ["True", "false", 1], "extra": ["ignored", "ignored", "ignored"]}
    )  # fmt: skip

    encoded = feature_array(caller, info)

    columns = list(info["feature_columns"])
    at = {name: columns.index(name) for name in FEATURES}
    assert encoded.dtype == np.float32 and encoded.shape == (3, len(columns))
    assert encoded[0, at["age"]] == 30 and np.isnan(encoded[1, at["age"]]) and encoded[2, at["age"]] == 41
    assert np.isnan(encoded[1:, at["income"]]).all()
    assert encoded[0, at["colour"]] == info["vocabularies"]["colour"].index("red")
    assert np.isnan(encoded[1, at["colour"]]) and encoded[2, at["colour"]] == UNSEEN
    assert encoded[1, at["city"]] == UNSEEN and np.isnan(encoded[2, at["city"]])
    assert encoded[:, at["member"]].tolist() == [1.0, 0.0, 1.0]
    # A JSON body's columns or rows, as MLflow hands them over to a model without an input schema.
    for parsed in (caller.to_dict(orient="list"), caller.to_dict(orient="records")):
        np.testing.assert_array_equal(feature_array(parsed, info), encoded)

    model = task.build_model(info).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.from_numpy(encoded))).all()
    with pytest.raises(InputError, match=r"^input row 2, column 'member': expected true or false"):
        feature_array(caller.assign(member=[True, "maybe", False]), info)
    with pytest.raises(InputError, match=r"^input row 1, column 'visits': expected a finite number"):
        feature_array(caller.assign(visits=["many", 1, 2]), info)
    with pytest.raises(InputError, match=r"^the input lacks feature column\(s\) city"):
        feature_array(caller.drop(columns=["city"]), info)


def test_class_weights_balance_the_classes_or_weigh_them_by_name(tmp_path):
    raw = write_batches(tmp_path / "raw", [mixed_table(300, 0)], "tier")
    _prepare(_task(), raw, tmp_path / "out")

    balanced = _task(class_weights="balanced").load(tmp_path / "out").info
    named = _task(class_weights={"gold": 3.0}).load(tmp_path / "out").info

    classes, counts = balanced["classes"], dict(read_manifest(tmp_path / "out").totals.labels)
    rows = sum(counts.values())
    assert balanced["class_weights"] == pytest.approx([rows / (3 * counts[index]) for index in range(3)])
    assert named["class_weights"] == [3.0 if name == "gold" else 1.0 for name in classes]
    with pytest.raises(InputError, match=r"class_weights names platinum, which are not classes of the data"):
        _task(class_weights={"platinum": 2.0}).load(tmp_path / "out")
    with pytest.raises(InputError, match=r"class_weights: a regression has no classes"):
        _task(label_column="spend", objective="regression", class_weights="balanced")
    with pytest.raises(InputError, match=r"class_weights gold = -1"):
        _task(class_weights={"gold": -1})

    task = _task(class_weights={"gold": 3.0})
    data = task.load(tmp_path / "out")
    model = task.build_model(data.info)
    batch = data.split("train")[torch.arange(64)]
    plain = _task().loss(model, batch, {**data.info, "class_weights": None})
    assert task.loss(model, batch, data.info).item() != pytest.approx(plain.item())


def test_a_regression_target_must_be_a_number(tmp_path):
    frame = mixed_table(200, 0)
    frame["spend"] = frame["spend"].astype(object)
    frame.loc[4, "spend"] = "lots"
    raw = write_batches(tmp_path / "raw", [frame], "spend")

    with pytest.raises(
        InputError, match=r"data row 5, column 'spend': expected a finite number \(the regression"
    ):
        _prepare(_task(label_column="spend", objective="regression"), raw, tmp_path / "out")
