"""Drift features of non-numeric inputs (training/tasks/features.py, training/data/token_shares.py): the
helpers' columns by hand, their pairing of current data with the reference's vocabulary, bad values
refused in one line, and `retrain drift` on a task that declares them, seeing a category's share move and
not an unchanged one's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.training.listings_task import CITIES, write_listings, write_prepared
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from core.errors import InputError
from training.cli import main
from training.drift.check import population_stability_index
from training.drift.data import comparable
from training.drift.options import REPORT_FILE
from training.mlflow_names import NAMES_ARTIFACT
from training.mlflow_setup import mlflow_client
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


# -- logged to MLflow ------------------------------------------------------------------------------------

MOVED_SHARES = (0.25, 0.3, 0.3, 0.15)  # aalborg half as often, a new city


def check_listings(tmp_path: Path, tracking_uri: str) -> dict:
    """`retrain drift` of the listings task, logged to `tracking_uri`; returns its report."""
    reference = write_prepared(tmp_path / "prepared", rows=600, seed=1)
    current = tmp_path / "arrivals"
    write_listings(current, 600, seed=2, cities=(*CITIES, "dublin"), city_shares=MOVED_SHARES)
    out = tmp_path / "check"
    places = ["--reference", str(reference), "--current", str(current), "--out", str(out)]
    task = ["--task", "helpers.training.listings_task:ListingsTask", "--mlflow-tracking-uri", tracking_uri]
    assert main(["drift", "--model-name", "listings", *places, *task]) == 0
    return json.loads((out / REPORT_FILE).read_text())


def the_drift_run(client: MlflowClient) -> Run:
    (run,) = client.search_runs([client.get_experiment_by_name("retrain-drift").experiment_id])
    return run


def test_a_drift_check_of_category_shares_logs_every_feature_to_mlflow_and_how_to_read_it_back(
    tmp_path: Path, caplog
):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    report = check_listings(tmp_path, uri)

    assert "could not log" not in caplog.text
    client = mlflow_client(uri)
    run = the_drift_run(client)
    assert run.info.status == "FINISHED"
    names = Path(client.download_artifacts(run.info.run_id, NAMES_ARTIFACT, str(tmp_path)))
    renamed = json.loads(names.read_text())
    # Every feature's PSI is there, under a key that reads back to the feature's name.
    features = {f"psi.{feature['name']}": feature["psi"] for feature in report["features"]}
    assert {"psi.city=aalborg", "psi.city:other", "psi.description:oov", "psi.price"} <= set(features)
    logged = {renamed.get(key, key): value for key, value in run.data.metrics.items()}
    assert {name: logged[name] for name in features} == pytest.approx(features)
    assert set(renamed) <= set(run.data.metrics)
    assert run.data.metrics["psi.city-_3daalborg"] == pytest.approx(features["psi.city=aalborg"])
    assert renamed["psi.city-_3aother"] == "psi.city:other"  # ':' too: MLflow on Windows refuses it
    assert "psi.price" in run.data.metrics and "psi.price" not in renamed  # a name MLflow takes stays


def test_a_drift_check_whose_logging_fails_ends_its_mlflow_run_failed(tmp_path: Path, caplog):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the experiment's artifact folder would be made")
    client = mlflow_client(uri)  # a fresh store from the schema template
    client.create_experiment("retrain-drift", artifact_location=(blocked / "artifacts").as_uri())

    report = check_listings(tmp_path, uri)  # drift is information: the check itself still succeeds

    run = the_drift_run(client)
    assert run.info.status == "FAILED" and run.info.end_time is not None
    assert run.data.metrics["psi.price"] == pytest.approx(report["features"][0]["psi"])  # logged up to there
    (line,) = [record.getMessage() for record in caplog.records if "could not log" in record.getMessage()]
    assert line.startswith("could not log the drift check to MLflow: ") and "\n" not in line
