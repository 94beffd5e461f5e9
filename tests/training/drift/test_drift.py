"""The drift check: PSI and KS against hand-computed cases, the verdict, its data, and `retrain drift`."""

from __future__ import annotations

import json
import math
import shlex
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow.csv as pa_csv
import pytest

from components.data_version import snapshot_folder
from components.specs import COMPONENTS_DIR, load_component_spec
from core.errors import InputError
from training.cli import build_parser, main
from training.drift.check import (
    EPSILON,
    DriftPolicy,
    DriftReport,
    FeatureDrift,
    bin_indices,
    compare,
    ks_test,
    population_stability_index,
    quantile_edges,
)
from training.drift.cli import REPORT_FILE
from training.drift.data import aligned, raw_data_version, reference_from_lineage
from training.drift.publish import TopicSettings, event_data, new_check_id
from training.gate.lineage import Trigger, lineage_of
from training.mlflow_setup import mlflow_client
from training.tasks.base import FeatureTable
from training.tasks.tabular.manifest import read_manifest
from training.tasks.tabular.sample_data import digits_table, with_shift, write_sample_batches
from training.tasks.tabular.schema import DIGITS_SCHEMA
from training.tasks.tabular.task import TabularTask

TEN = np.arange(10.0)  # quantile edges at 0, 4.5 and 9 with two bins


def psi_term(current: float, reference: float) -> float:
    return (current - reference) * math.log(current / reference)


# -- the measures ----------------------------------------------------------------------------------------


def test_bins_are_the_reference_quantiles_plus_one_below_and_one_above():
    edges = quantile_edges(TEN, bins=2)

    assert edges.tolist() == [0.0, 4.5, 9.0]
    values = np.array([-1.0, 0.0, 4.5, 4.6, 9.0, 10.0])
    assert bin_indices(values, edges).tolist() == [0, 1, 1, 2, 2, 3]


def test_a_constant_reference_gets_a_bin_for_its_value_and_one_either_side():
    edges = quantile_edges(np.full(5, 3.0))

    assert edges.tolist() == [3.0]
    assert bin_indices(np.array([2.0, 3.0, 4.0]), edges).tolist() == [0, 1, 2]


def test_psi_of_a_hand_computed_shift():
    # reference shares of [0, 4.5] and (4.5, 9]: 0.5 and 0.5; current: 2 of 8 and 6 of 8.
    current = np.array([1.0, 2.0, 5.0, 6.0, 7.0, 8.0, 9.0, 9.0])

    expected = psi_term(0.25, 0.5) + psi_term(0.75, 0.5)
    assert population_stability_index(TEN, current, bins=2) == pytest.approx(expected)
    assert population_stability_index(TEN, TEN, bins=2) == 0.0


def test_values_the_reference_never_took_count_through_the_epsilon_floor():
    beyond = np.full(4, 20.0)  # every row above the reference's maximum

    expected = 2 * psi_term(EPSILON, 0.5) + psi_term(1.0, EPSILON)
    assert population_stability_index(TEN, beyond, bins=2) == pytest.approx(expected)
    assert math.isfinite(expected) and expected > 9


def test_psi_of_a_constant_feature():
    reference = np.full(6, 3.0)

    assert population_stability_index(reference, np.full(4, 3.0)) == 0.0
    half_lower = np.array([2.0, 2.0, 3.0, 3.0])
    expected = psi_term(0.5, EPSILON) + psi_term(0.5, 1.0)
    assert population_stability_index(reference, half_lower) == pytest.approx(expected)


def test_ks_of_separated_and_of_identical_samples():
    # Exact two-sided test for 3 against 3 fully separated values: 2 of the C(6, 3) = 20 orderings.
    statistic, pvalue = ks_test(np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0]))
    assert (statistic, pvalue) == (1.0, pytest.approx(0.1))
    assert ks_test(TEN, TEN) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("values", "message"),
    [(np.array([]), "non-empty 1-D"), (np.array([1.0, np.nan]), "NaN or infinity")],
)
def test_bad_measure_input_is_refused(values, message):
    with pytest.raises(InputError, match=message):
        population_stability_index(TEN, values)


# -- the verdict -----------------------------------------------------------------------------------------


def test_a_feature_drifts_only_when_the_move_is_both_material_and_significant():
    small_but_moved = np.array([1.0, 2.0, 5.0, 6.0, 7.0, 8.0, 9.0, 9.0])  # PSI 0.27, but 8 rows: p ~ 0.9
    policy = DriftPolicy(bins=2)

    report = compare(TEN[:, None], small_but_moved[:, None], ["x"], policy)
    assert report.features[0].psi > policy.psi_threshold
    assert report.features[0].ks_pvalue > policy.ks_pvalue
    assert not report.features[0].drifted and not report.alert

    far = compare(np.tile(TEN, 20)[:, None], np.full((200, 1), 20.0), ["x"], policy)
    assert far.features[0].drifted and far.alert


def test_an_alert_needs_the_policys_number_of_drifted_features():
    features = (
        FeatureDrift("a", 0.5, 0.4, 1e-9, True),
        FeatureDrift("b", 0.9, 0.6, 1e-12, True),
        FeatureDrift("c", 0.01, 0.01, 0.9, False),
    )

    def report(min_drifted: int) -> DriftReport:
        return DriftReport(DriftPolicy(min_drifted_features=min_drifted), features, 10, 20, "dv-1", None)

    assert report(2).alert and not report(3).alert
    assert report(2).worst.name == "b" and report(2).max_psi == 0.9
    document = json.loads(json.dumps(report(2).to_dict()))
    assert document["drifted_features"] == ["a", "b"]
    assert document["reference"] == {"data_version": "dv-1", "rows": 10}
    assert report(3).summary().startswith("no alert: 2 of 3 features drifted (alert at 3)")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"psi_threshold": 0.0}, r"--psi-threshold 0\.0: expected a positive number"),
        ({"psi_threshold": float("nan")}, "--psi-threshold nan"),
        ({"ks_pvalue": 1.0}, "--ks-pvalue 1.0: expected a p-value between 0 and 1"),
        ({"min_drifted_features": 0}, "--min-drifted-features 0: expected a whole number of at least 1"),
        ({"min_drifted_features": True}, "--min-drifted-features True"),
        ({"bins": 1}, "--bins 1: expected a whole number from 2 to 100"),
    ],
)
def test_a_bad_policy_is_refused_in_one_line_naming_the_option(options, message):
    with pytest.raises(InputError, match=message) as raised:
        DriftPolicy(**options)
    assert "\n" not in str(raised.value)


def test_data_of_the_wrong_shape_is_refused():
    with pytest.raises(
        InputError, match=r"the current data has shape \(3, 2\); expected at least one row of 1"
    ):
        compare(TEN[:, None], np.zeros((3, 2)), ["x"])


# -- shifted sample data ---------------------------------------------------------------------------------


def test_shifted_digits_move_right_and_brighten_within_the_valid_range():
    table = digits_table()
    shifted = with_shift(table, 0.5)  # one column right, brightness x1.5

    def images(source) -> np.ndarray:
        columns = [source.column(name).to_numpy() for name in DIGITS_SCHEMA.feature_columns]
        return np.column_stack(columns).reshape(-1, 8, 8)

    before, after = images(table), images(shifted)
    assert after.dtype == np.int64 and after.min() == 0 and after.max() == 16
    assert (after[:, :, 0] == 0).all()
    assert np.array_equal(after[:, :, 1:], np.minimum(np.floor(before[:, :, :7] * 1.5 + 0.5), 16))
    assert shifted.column("label").equals(table.column("label"))
    assert shifted.column("row_key").equals(table.column("row_key"))
    assert with_shift(table, 0.0).equals(table)
    with pytest.raises(InputError, match=r"--shift 1\.5: expected a strength from 0 to 1"):
        with_shift(table, 1.5)


# -- the data and its versions ---------------------------------------------------------------------------


def test_a_pinned_folders_version_is_the_one_components_computed(tmp_path):
    write_sample_batches(tmp_path / "landing", batches=2)
    manifest, pinned = snapshot_folder(tmp_path / "landing", tmp_path / "pins")

    assert raw_data_version(pinned) == manifest.version
    assert raw_data_version(tmp_path / "landing") is None  # no manifest beside it: unknown
    (pinned / "batch-0002.csv").chmod(0o644)  # published read-only: changing it takes a chmod (or root)
    (pinned / "batch-0002.csv").write_text(
        (pinned / "batch-0002.csv").read_text().replace("digits", "DIGITS")
    )
    assert raw_data_version(pinned) is None  # the folder no longer holds what was pinned


def test_the_reference_follows_lineage_and_refuses_changed_or_missing_data(prepared_data, tmp_path):
    manifest = read_manifest(prepared_data)
    tags = lineage_of(
        prepared_data,
        manifest.data_version,
        Trigger.parse("manual"),
        "rd-0123456789abcdef",
        "1",
        None,
        "0",
        None,
    ).tags()

    task = TabularTask()
    reference = reference_from_lineage(task, tags, "models:/digits/3", "3")
    assert (reference.data_version, reference.raw_data_version) == (
        manifest.data_version,
        "rd-0123456789abcdef",
    )
    assert reference.features.values.shape == (manifest.split_rows("train"), 64)
    assert reference.features.names == DIGITS_SCHEMA.feature_columns
    changed = {**tags, "retrain.data.manifest_sha256": "0" * 64}
    with pytest.raises(InputError, match=r"sha256 differs from models:/digits/3's"):
        reference_from_lineage(task, changed, "models:/digits/3", "3")
    gone = {**tags, "retrain.data.manifest_path": str(tmp_path / "gone" / "manifest.json")}
    with pytest.raises(InputError, match=r"is gone .*; pass --reference DIR"):
        reference_from_lineage(task, gone, "models:/digits/3", "3")


def test_current_features_are_compared_by_name_and_other_features_are_refused():
    reference = FeatureTable(("a", "b"), np.array([[1.0, 2.0]]))
    assert aligned(reference, FeatureTable(("b", "a"), np.array([[2.0, 1.0]]))).tolist() == [[1.0, 2.0]]
    with pytest.raises(
        InputError, match=r"its features differ from the reference's \(missing \['b'\], extra \['c'\]\)"
    ):
        aligned(reference, FeatureTable(("a", "c"), np.array([[1.0, 3.0]])))


# -- the event and its settings --------------------------------------------------------------------------


def test_the_event_data_carries_the_trigger_contract_and_the_scores():
    report = compare(TEN[:, None], TEN[:, None] + 0.5, ["x"], current_data_version="rd-00112233445566ff")
    check_id = new_check_id(datetime(2026, 11, 29, 10, 41))

    data = json.loads(json.dumps(event_data(report, "digits", check_id)))
    assert check_id.startswith("drift-20261129T104100Z-")
    assert {key: data[key] for key in ("model_name", "check_id", "metric", "threshold")} == {
        "model_name": "digits",
        "check_id": check_id,
        "metric": "psi",
        "threshold": 0.2,
    }
    assert data["value"] == report.max_psi and data["data_version"] == "rd-00112233445566ff"
    assert set(data["features"]["x"]) == {"psi", "ks_statistic", "ks_pvalue", "drifted"}
    unknown = event_data(compare(TEN[:, None], TEN[:, None], ["x"]), "digits", check_id)
    assert "data_version" not in unknown


def test_topic_settings_refuse_a_token_over_http_and_never_show_the_key():
    key = "k3y-" + "s" * 40
    assert TopicSettings.from_environ({}) is None
    settings = TopicSettings.from_environ(
        {"RETRAIN_DRIFT_TOPIC_ENDPOINT": "http://127.0.0.1:9/api/events", "RETRAIN_DRIFT_TOPIC_KEY": key}
    )
    assert settings is not None and key not in repr(settings)
    assert settings.mask(f"refused {key} here") == "refused *** here"
    with pytest.raises(InputError, match="is http://: an Azure identity token is sent only over https"):
        TopicSettings("http://topic.example/api/events")
    with pytest.raises(
        InputError, match="RETRAIN_DRIFT_TOPIC_ENDPOINT 'ftp://x/api': expected the topic's URL"
    ):
        TopicSettings("ftp://x/api", key)


# -- `retrain drift` -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shifted_raw(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("shifted") / "raw"
    write_sample_batches(folder, batches=2, shift=0.5)
    return folder


def run_drift(capsys, *arguments: str) -> tuple[int, str]:
    code = main(["drift", "--model-name", "digits", *arguments])
    return code, capsys.readouterr().out.strip().splitlines()[-1]


def test_identical_data_raises_no_alert_and_shifted_data_does(prepared_data, shifted_raw, tmp_path, capsys):
    no_tracking = ("--reference", str(prepared_data), "--mlflow-tracking-uri", "off")

    code, line = run_drift(
        capsys, "--current", str(prepared_data.parent / "raw"), *no_tracking, "--out", str(tmp_path / "same")
    )
    assert code == 0 and line.startswith("drift digits: no alert: 0 of 64 features drifted")
    same = json.loads((tmp_path / "same" / REPORT_FILE).read_text())
    assert not same["alert"] and same["max_psi"] < 0.01
    assert same["reference"]["data_version"] == read_manifest(prepared_data).data_version
    assert same["current"]["rows"] == 1797 and same["current"]["data_version"] is None

    code, line = run_drift(
        capsys, "--current", str(shifted_raw), *no_tracking, "--out", str(tmp_path / "moved")
    )
    assert code == 0 and line.startswith("drift digits: ALERT: drift detected: ")
    assert line.endswith("not published (RETRAIN_DRIFT_TOPIC_ENDPOINT is not set)")
    moved = json.loads((tmp_path / "moved" / REPORT_FILE).read_text())
    assert moved["alert"] and moved["drifted_count"] > 32
    assert (tmp_path / "moved" / "drift_psi.png").read_bytes().startswith(b"\x89PNG")


def test_the_check_follows_the_champions_lineage_and_logs_to_mlflow(
    prepared_data, shifted_raw, tmp_path, capsys
):
    # A registered version carrying the register step's lineage tags, and the champion alias: the registry
    # as the drift check reads it, without the cost of training and registering a model.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    manifest = read_manifest(prepared_data)
    tags = lineage_of(
        prepared_data,
        manifest.data_version,
        Trigger.parse("manual"),
        "rd-00000000000000aa",
        "1",
        None,
        "0",
        None,
    ).tags()
    client = mlflow_client(uri, registry_uri=uri)  # a fresh store from the schema template
    client.create_registered_model("digits")
    version = client.create_model_version("digits", (tmp_path / "model").as_uri(), tags=tags)
    client.set_registered_model_alias("digits", "champion", version.version)

    code, line = run_drift(
        capsys, "--current", str(shifted_raw), "--mlflow-tracking-uri", uri, "--out", str(tmp_path / "out")
    )

    assert code == 0 and "ALERT" in line
    document = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert document["reference"]["source"] == "lineage"
    assert document["reference"]["model_version"] == str(version.version)
    assert document["reference"]["raw_data_version"] == "rd-00000000000000aa"
    experiment = client.get_experiment_by_name("retrain-drift")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.params == {key: str(value) for key, value in DriftPolicy().describe().items()}
    assert run.data.metrics["max_psi"] == pytest.approx(document["max_psi"])
    assert run.data.metrics["drifted_features"] == document["drifted_count"]
    assert run.data.metrics["psi.pixel_38"] == pytest.approx(document["features"][38]["psi"])
    assert run.data.tags["retrain.drift.alert"] == "true"
    assert run.data.tags["retrain.drift.check_id"] == document["check_id"]
    assert run.data.tags["retrain.drift.reference_data_version"] == manifest.data_version
    assert run.data.tags["retrain.drift.current_data_version"] == "unknown"
    assert {artifact.path for artifact in client.list_artifacts(run.info.run_id)} == {
        REPORT_FILE,
        "drift_psi.png",
    }


def test_bad_options_stop_the_check_with_one_line(prepared_data, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RETRAIN_DRIFT_TOPIC_ENDPOINT", raising=False)
    current = str(prepared_data.parent / "raw")
    base = ["drift", "--model-name", "digits", "--current", current, "--out", str(tmp_path / "out")]

    assert main([*base, "--reference", str(prepared_data), "--publish", "--mlflow-tracking-uri", "off"]) == 2
    assert "--publish: RETRAIN_DRIFT_TOPIC_ENDPOINT is not set" in capsys.readouterr().err
    assert main([*base, "--mlflow-tracking-uri", "off"]) == 2
    assert "give --reference DIR with a prepared data version" in capsys.readouterr().err
    assert main([*base, "--reference", str(prepared_data), "--psi-threshold", "-1"]) == 2
    assert "--psi-threshold -1.0: expected a positive number" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_drift_component_runs_this_command_with_the_policys_defaults():
    spec = load_component_spec(COMPONENTS_DIR / "drift.yml")
    defaults = {name: port.default for name, port in spec.inputs.items() if port.default is not None}
    assert defaults == DriftPolicy().describe()

    command = spec.command.replace("$[[", "").replace("]]", "")
    for name in spec.inputs:
        command = command.replace(f"${{{{inputs.{name}}}}}", str(defaults.get(name, f"/in/{name}")))
    command = command.replace("${{outputs.report}}", "/out/report")
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "training.cli"]
    args = build_parser().parse_args(argv[3:])
    assert (args.command, args.reference, args.psi_threshold) == ("drift", Path("/in/reference_data"), 0.2)


def test_shifted_sample_data_from_the_command_line(tmp_path):
    assert main(["sample-data", "--out", str(tmp_path / "raw"), "--batches", "1", "--shift", "1"]) == 0
    table = pa_csv.read_csv(tmp_path / "raw" / "batch-0001.csv")
    pixels = np.column_stack([table.column(name).to_numpy() for name in DIGITS_SCHEMA.feature_columns])
    assert pixels[:, [0, 1, 8, 9]].max() == 0 and pixels.max() == 16  # two columns right, brighter
