"""Missing values in a drift check: NaN is a missing value, its share is compared as `NAME:missing`, the
present values as the feature itself, and infinity is refused in one line naming the side and feature."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.errors import InputError
from training.drift.check import DriftReport, compare
from training.drift.cli import plot_psi
from training.drift.data import comparable
from training.drift.publish import event_data
from training.drift.tracking import log_check, tracking_of
from training.mlflow_names import NAMES_ARTIFACT
from training.mlflow_setup import mlflow_client
from training.tasks.base import FeatureTable
from training.tasks.features import category_shares

ROWS = 4000


def normal(seed: int, shift: float = 0.0, missing: float = 0.0) -> np.ndarray:
    """ROWS draws of N(shift, 1), a `missing` share of them (random rows, fixed seed) NaN."""
    rng = np.random.default_rng(seed)
    values = rng.normal(shift, 1.0, ROWS)
    values[rng.random(ROWS) < missing] = np.nan
    return values


def by_name(report: DriftReport) -> dict:
    return {feature.name: feature for feature in report.features}


def test_the_same_distribution_with_a_few_missing_values_both_sides_raises_no_alert():
    report = compare(normal(1, missing=0.05)[:, None], normal(2, missing=0.05)[:, None], ["x"])

    assert [feature.name for feature in report.features] == ["x", "x:missing"]
    assert not report.alert and report.drifted == ()
    assert by_name(report)["x:missing"].psi < 0.01
    assert by_name(report)["x"].psi < 0.05  # present values only: the NaN rows do not count on x's scale


def test_a_jump_in_the_missing_rate_drifts_the_missing_feature_alone():
    report = compare(normal(1, missing=0.05)[:, None], normal(2, missing=0.40)[:, None], ["x"])

    assert report.alert and report.drifted == ("x:missing",)
    missing = by_name(report)["x:missing"]
    assert missing.psi > 0.2 and missing.ks_pvalue < 1e-6
    assert missing.ks_statistic == pytest.approx(0.35, abs=0.03)  # the missing rate's jump
    assert report.worst.name == "x:missing"
    assert "max PSI" in report.summary() and "on x:missing" in report.summary()


def test_shifted_values_drift_the_feature_with_missing_values_present():
    report = compare(normal(1, missing=0.05)[:, None], normal(2, shift=1.0, missing=0.05)[:, None], ["x"])

    assert report.alert and report.drifted == ("x",)
    assert by_name(report)["x"].psi > 0.2
    assert not by_name(report)["x:missing"].drifted


def test_a_feature_missing_on_one_side_is_judged_by_its_missing_share_alone():
    reference = np.column_stack([normal(1, missing=0.05), normal(3)])
    current = np.column_stack([np.full(ROWS, np.nan), normal(4)])

    report = compare(reference, current, ["x", "y"])

    assert [feature.name for feature in report.features] == ["x:missing", "y"]
    assert report.alert and report.drifted == ("x:missing",)
    assert by_name(report)["x:missing"].ks_statistic == pytest.approx(0.95, abs=0.02)
    document = json.loads(json.dumps(report.to_dict()))
    assert document["drifted_features"] == ["x:missing"] and document["worst_feature"] == "x:missing"
    assert [feature["name"] for feature in document["features"]] == ["x:missing", "y"]

    gone_before = compare(current[:, :1], reference[:, :1], ["x"])  # the reference side has none
    assert [feature.name for feature in gone_before.features] == ["x:missing"] and gone_before.alert


def test_a_feature_missing_everywhere_is_one_unmoved_missing_feature():
    report = compare(np.full((5, 1), np.nan), np.full((3, 1), np.nan), ["x"])

    (feature,) = report.features
    assert (feature.name, feature.psi, feature.ks_statistic, feature.drifted) == (
        "x:missing",
        0.0,
        0.0,
        False,
    )
    assert not report.alert and report.summary().startswith("no alert: 0 of 1 features drifted")


def test_data_without_missing_values_gets_no_missing_feature():
    report = compare(normal(1)[:, None], normal(2, missing=0.0)[:, None], ["x"])

    assert [feature.name for feature in report.features] == ["x"]


@pytest.mark.parametrize(
    ("side", "value", "message"),
    [
        ("reference", np.inf, r"the reference data holds inf in feature 'y' \(row 2\)"),
        ("current", -np.inf, r"the current data holds -inf in feature 'y' \(row 2\)"),
    ],
)
def test_infinity_is_refused_in_one_line_naming_the_side_and_the_feature(side, value, message):
    data = {"reference": np.zeros((4, 2)), "current": np.zeros((4, 2))}
    data[side][1, 0] = np.nan  # a missing value is fine; the infinity is not
    data[side][2, 1] = value

    with pytest.raises(InputError, match=message) as raised:
        compare(data["reference"], data["current"], ["x", "y"])
    assert "\n" not in str(raised.value)
    assert str(raised.value).endswith("expected finite numbers, or NaN for a missing value")


def test_a_feature_named_like_another_s_missing_indicator_is_refused_only_when_they_would_clash():
    clean = np.zeros((4, 2))
    assert [f.name for f in compare(clean, clean, ["x", "x:missing"]).features] == ["x", "x:missing"]

    with_missing = clean.copy()
    with_missing[0, 0] = np.nan
    with pytest.raises(
        InputError, match=r"'x:missing' is both a feature and the missing-value indicator of 'x'"
    ):
        compare(clean, with_missing, ["x", "x:missing"])


def test_missing_numbers_beside_category_shares_compare_through_the_feature_tables():
    rng = np.random.default_rng(5)
    numbers = normal(1, missing=0.05)
    reference = FeatureTable(
        ("price",), numbers[:, None], category_shares(rng.choice(["a", "b"], ROWS), name="city").groups
    )
    current_numbers = normal(2, missing=0.40)
    current = FeatureTable(
        ("price",),
        current_numbers[:, None],
        category_shares(rng.choice(["a", "b"], ROWS), name="city").groups,
    )

    numeric, current_values = comparable(reference, current)
    report = compare(numeric.values, current_values, numeric.names)

    assert [feature.name for feature in report.features] == [
        "price", "price:missing", "city=a", "city=b", "city:other"
    ]  # fmt: skip
    assert report.drifted == ("price:missing",)


def test_a_missing_feature_is_logged_to_mlflow_charted_and_published_under_its_name(tmp_path: Path, caplog):
    report = compare(
        normal(1, missing=0.05)[:, None], normal(2, missing=0.40)[:, None], ["x"], current_data_version=None
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    check_id = "drift-20260101T000000Z-000000000000"
    document = {
        "check_id": check_id,
        "model_name": "m",
        "reference": {"data_version": "dv-1", "raw_data_version": None, "model_version": None},
        "current": {"data_version": None},
    }
    tracking = tracking_of(uri, {}, tmp_path / "state")
    assert tracking is not None

    run_id = log_check(tracking, "retrain-drift", {}, document, report, [], None)

    assert run_id is not None and "could not log" not in caplog.text
    client = mlflow_client(uri)
    run = client.get_run(run_id)
    names = json.loads(Path(client.download_artifacts(run_id, NAMES_ARTIFACT, str(tmp_path))).read_text())
    assert names["psi.x-_3amissing"] == "psi.x:missing"  # ':' escaped, as for `NAME:other`
    assert run.data.metrics["psi.x-_3amissing"] == pytest.approx(by_name(report)["x:missing"].psi)
    assert run.data.metrics["psi.x"] == pytest.approx(by_name(report)["x"].psi)
    assert run.data.tags["retrain.drift.worst_feature"] == "x:missing"

    data = json.loads(json.dumps(event_data(report, "m", check_id)))
    assert data["drifted_features"] == ["x:missing"] and set(data["features"]) == {"x", "x:missing"}
    assert plot_psi(report, tmp_path / "psi.png").read_bytes().startswith(b"\x89PNG")
