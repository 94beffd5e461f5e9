"""Drift features of non-numeric inputs (training/tasks/features.py, training/data/token_shares.py): the
helpers' columns by hand, their pairing of current data with the reference's vocabulary, bad values
refused in one line, and `retrain drift` on a task that declares them, seeing a category's share move and
not an unchanged one's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.training.listings_task import write_listings, write_prepared

from core.errors import InputError
from training.cli import main
from training.drift.check import population_stability_index
from training.drift.data import comparable
from training.drift.options import REPORT_FILE
from training.tasks.features import category_shares, combine, numeric_features, text_features


def test_categories_are_one_hot_columns_of_the_reference_s_categories_and_other():
    reference = category_shares(["b", "a", "b", "c"], name="city")
    current = category_shares(["a", "d", "b", "e"], name="city")  # d and e: never in the reference

    numeric, values = comparable(reference, current)

    # Columns by the reference's frequency (b twice), ties by name; what it never had counts as other.
    assert numeric.names == ("city=b", "city=a", "city=c", "city:other")
    assert numeric.values.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
    assert values.tolist() == [[0, 1, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 1]]
    # A column's mean is its category's share of rows: what a drift check compares.
    assert values.mean(axis=0).tolist() == [0.25, 0.25, 0.0, 0.5]


def test_fixed_categories_fix_the_columns_and_numbers_name_one_category_however_parsed():
    reference = category_shares([1, 2.0, 2], name="rooms", categories=[1, 2, 3])
    current = category_shares([3.0, np.int64(4), b"1"], name="rooms", categories=[1, 2, 3])

    numeric, values = comparable(reference, current)

    assert numeric.names == ("rooms=1", "rooms=2", "rooms=3", "rooms:other")
    assert numeric.values.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0]]
    assert values.tolist() == [[0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0]]


def test_text_is_its_lengths_top_token_shares_and_out_of_vocabulary_rate():
    reference = text_features(["The cat sat", "the cat", "a dog"], name="note", top_k=2)
    current = text_features(["Cat and dog", "", "the the"], name="note", top_k=2)

    numeric, values = comparable(reference, current)

    assert numeric.names == (
        "note:chars", "note:tokens", "note=cat", "note=the", "note:other", "note:oov"
    )  # fmt: skip
    third = 1 / 3
    expected = [[11, 3, third, third, third, 0], [7, 2, 0.5, 0.5, 0, 0], [5, 2, 0, 0, 1, 0]]
    np.testing.assert_allclose(numeric.values, expected)
    # "and" was never in the reference: out of vocabulary; "dog" was, outside the top 2: other only.
    np.testing.assert_allclose(
        values, [[11, 3, third, 0, 2 * third, third], [0, 0, 0, 0, 0, 0], [7, 2, 0, 1, 0, 0]]
    )


def test_combined_tables_keep_their_numbers_and_groups_and_must_describe_the_same_rows():
    table = combine(
        numeric_features({"price": [1.0, 2.0]}),
        category_shares(["x", "y"], name="kind"),
        text_features(["a b", "c"], name="note"),
    )
    assert table.names == ("price", "note:chars", "note:tokens")
    assert [group.name for group in table.groups] == ["kind", "note"]
    assert len(table) == 2

    with pytest.raises(InputError, match=r"^combine: tables of \[1, 2\] rows; expected the same items"):
        combine(numeric_features({"price": [1.0, 2.0]}), category_shares(["x"], name="kind"))


def test_the_current_data_must_hold_the_reference_s_groups():
    reference = combine(numeric_features({"price": [1.0]}), category_shares(["x"], name="kind"))
    with pytest.raises(
        InputError, match=r"^--current: its token groups \[\] differ from the reference's \['kind'\]"
    ):
        comparable(reference, numeric_features({"price": [1.0]}))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: category_shares(["a", float("nan")], name="city"), "city row 1: nan; expected a category"),
        (lambda: category_shares(["a", None], name="city"), "city row 1: missing; expected a category"),
        (lambda: category_shares([b"\xff"], name="city"), r"city row 0: not UTF-8 text \(byte 0xff at 0\)"),
        (
            lambda: category_shares([[1]], name="city"),
            r"city row 0: \[1\]; expected a category: text or a finite",
        ),
        (
            lambda: text_features(["ok", b"caf\xe9"], name="note"),
            r"note row 1: not UTF-8 text \(byte 0xe9 at 3\)",
        ),
        (
            lambda: text_features([b"\xffab".decode("utf-8", "surrogateescape")], name="note"),
            r"note row 0: not UTF-8 text \(undecodable character at 0\)",
        ),
        (lambda: text_features(["a", float("nan")], name="note"), "note row 1: missing; expected text"),
        (
            lambda: numeric_features({"price": [1.0, float("inf")]}),
            "price row 1: inf; expected a finite number",
        ),
        (lambda: numeric_features({"price": [1.0, "x"]}), "price row 1: 'x'; expected a finite number"),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_the_input_and_row(make, message: str):
    with pytest.raises(InputError, match=f"^{message}") as refused:
        make()
    assert "\n" not in str(refused.value)


def test_a_flag_s_share_moving_is_a_psi_shift_and_an_unmoved_one_is_not():
    # Quantile bins would hold 0 and 1 in one bin: binned by value, a share of 0.3 -> 0.6 shows.
    reference = np.array([1.0] * 30 + [0.0] * 70)
    moved, same = np.array([1.0] * 60 + [0.0] * 40), np.array([0.0] * 70 + [1.0] * 30)

    expected = (0.4 - 0.7) * np.log(0.4 / 0.7) + (0.6 - 0.3) * np.log(0.6 / 0.3)
    assert population_stability_index(reference, moved) == pytest.approx(expected)
    assert population_stability_index(reference, same) == 0.0


def test_retrain_drift_sees_a_city_share_move_and_not_the_unchanged_kind(tmp_path: Path, capsys):
    reference = write_prepared(tmp_path / "prepared", rows=2000, seed=1)
    current = tmp_path / "arrivals"  # aalborg half as often, bergen as often, cork more, a new city
    write_listings(
        current,
        2000,
        seed=2,
        cities=("aalborg", "bergen", "cork", "dublin"),
        city_shares=(0.25, 0.3, 0.3, 0.15),
    )
    task = ["--task", "helpers.training.listings_task:ListingsTask"]
    out = tmp_path / "check"

    places = ["--reference", str(reference), "--current", str(current), "--out", str(out)]
    code = main(["drift", "--model-name", "listings", *places, *task, "--mlflow-tracking-uri", "off"])

    assert code == 0
    report = json.loads((out / REPORT_FILE).read_text())
    drifted = {feature["name"] for feature in report["features"] if feature["drifted"]}
    names = [feature["name"] for feature in report["features"]]
    assert names[:2] == ["price", "description:chars"] and "kind=flat" in names and "description:oov" in names
    assert {"city=aalborg", "city:other"} <= drifted  # a share halved, and dublin, never seen before
    assert not {name for name in drifted if not name.startswith("city")}, drifted  # kind, price, text: same
    assert (
        capsys.readouterr().out.strip().splitlines()[-1].startswith("drift listings: ALERT: drift detected")
    )
