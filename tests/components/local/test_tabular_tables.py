"""The built-in tabular task on the tables people have, from a configuration file alone: numeric,
categorical and boolean columns with blanks in every feature, and a label that is a class name (or, for a
regression, a number). Each case runs `retrain run` as a user does, and checks the result against what a
user would otherwise reach for: scikit-learn's HistGradientBoosting on the same split of the same rows.

Then the champion is used as it is in production: served in process from `pandas.read_csv` of a raw file
holding a city training never saw and blanks, and by `mlflow models serve` from a `text/csv` body and
the JSON forms; and `retrain drift` compares new batches with its training data, logging to MLflow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from helpers.components.run_harness import QUICK, retrain_run
from helpers.training.mixed_table import CITIES, FEATURES, TIERS, mixed_table, write_batches
from helpers.training.model_server import invoke, mlflow_models_serve
from mlflow.tracking import MlflowClient
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.metrics import f1_score, mean_absolute_error

from components.local import RunRecord
from components.model_config import MODELS_DIR_VARIABLE
from components.specs import REPO_ROOT
from training.cli import main as training_main
from training.tasks.tabular.manifest import Manifest, read_manifest, read_split_table

ROWS = 3000
CONFIG = """name = "{name}"

[task]
ref = "tabular"

[task.options]
label_column = "{label}"
key_column = "id"
objective = "{objective}"

[gate]
primary_metric = "{primary}"
{floors}

[pipeline]
epochs = 10
global_batch_size = 128
learning_rate = 0.003
"""


@dataclass(frozen=True)
class Trained:
    """One `retrain run` of a generated table: its folders, run record and registration."""

    root: Path
    name: str
    label: str
    record: RunRecord
    registration: dict

    @property
    def prepared(self) -> Path:
        return Path(self.record.step("prep").outputs["prepared_data"])

    @property
    def store(self) -> str:
        return f"sqlite:///{self.root / '.retrain' / 'mlflow.db'}"

    def champion(self, monkeypatch: pytest.MonkeyPatch) -> mlflow.pyfunc.PyFuncModel:
        """The champion as a user loads it; the store named for this test alone (a process-wide
        `mlflow.set_tracking_uri` would also be the next run's)."""
        monkeypatch.setenv("MLFLOW_TRACKING_URI", self.store)
        monkeypatch.setenv("MLFLOW_REGISTRY_URI", self.store)
        return mlflow.pyfunc.load_model(f"models:/{self.name}@champion")


def _run(root: Path, name: str, label: str, objective: str, primary: str, floors: str = "") -> Trained:
    models = root / "models"
    models.mkdir(parents=True)
    config = CONFIG.format(name=name, label=label, objective=objective, primary=primary, floors=floors)
    (models / f"{name}.toml").write_text(config)
    raw = write_batches(root / "raw", [mixed_table(ROWS, 0)], label)
    record, registration, _ = retrain_run(
        root / ".retrain", models, "--model-name", name, "--data", str(raw), *QUICK
    )
    assert (registration["decision"]["accepted"], registration["registered_version"]) == (True, "1")
    return Trained(root, name, label, record, registration)


@pytest.fixture(scope="module")
def classified(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    # A first model must beat the noise this table has (the default floors are the digits sample's).
    floors = "first_model_floors = { macro_f1 = 0.7 }"
    return _run(tmp_path_factory.mktemp("classified"), "tiers", "tier", "classification", "macro_f1", floors)


@pytest.fixture(scope="module")
def regressed(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return _run(tmp_path_factory.mktemp("regressed"), "spending", "spend", "regression", "rmse")


@pytest.fixture(autouse=True)
def _no_stray_configuration(monkeypatch):
    monkeypatch.delenv(MODELS_DIR_VARIABLE, raising=False)


def _split(folder: Path, manifest: Manifest, split: str, label: str) -> tuple[pd.DataFrame, pd.Series]:
    """A split's rows as gradient boosting takes them: categories as pandas categories, blanks as NaN."""
    table = read_split_table(folder, manifest, split).to_pandas()
    features = table[list(FEATURES)].astype({"member": "float64"})
    return features, table[label]


def _gradient_boosting(trained: Trained, model: type) -> tuple[np.ndarray, pd.Series]:
    """scikit-learn's HistGradientBoosting, with native categorical and missing-value support, trained
    on the run's train split; its predictions of the run's test split, and the labels."""
    manifest = read_manifest(trained.prepared)
    x_train, y_train = _split(trained.prepared, manifest, "train", trained.label)
    x_test, y_test = _split(trained.prepared, manifest, "test", trained.label)
    for name in ("colour", "city"):  # one category list for both splits
        categories = sorted(set(x_train[name].dropna()) | set(x_test[name].dropna()))
        x_train[name] = pd.Categorical(x_train[name], categories=categories)
        x_test[name] = pd.Categorical(x_test[name], categories=categories)
    fitted = model(categorical_features="from_dtype", random_state=0).fit(x_train, y_train)
    return fitted.predict(x_test), y_test


def test_a_mixed_table_trains_from_its_configuration_as_well_as_gradient_boosting(classified: Trained):
    manifest = read_manifest(classified.prepared)
    # What the configuration left open, the data decided, and the manifest records it.
    schema = manifest.schema
    assert dict(zip(schema.feature_columns, schema.feature_types, strict=True)) == {
        "age": "numeric", "income": "numeric", "visits": "numeric", "colour": "categorical",
        "city": "categorical", "member": "boolean",
    }  # fmt: skip
    assert (schema.label_kind, sorted(schema.classes)) == ("name", sorted(TIERS))
    assert sorted(manifest.vocabularies["city"]) == sorted(CITIES)
    assert all(missing > 0 for missing in manifest.totals.missing)  # every feature has blanks

    predicted, labels = _gradient_boosting(classified, HistGradientBoostingClassifier)
    baseline = f1_score(labels, predicted, average="macro")
    ours = classified.registration["metrics"]["macro_f1"]
    assert classified.registration["evaluated_on"]["rows"] == len(labels)  # the same test rows
    assert ours >= baseline - 0.02, (ours, baseline)


def test_the_champion_serves_a_raw_file_with_an_unseen_city_and_blanks(
    classified: Trained, tmp_path, monkeypatch
):
    frame = mixed_table(300, 9, first_id=10**6, cities=[*CITIES[:10], "atlantis"])
    raw = write_batches(tmp_path / "new", [frame], "tier") / "batch-0001.csv"
    table = pd.read_csv(raw)  # blanks read as NaN, member as object (True/False/NaN), the label too
    assert table["city"].eq("atlantis").any() and table[list(FEATURES)].isna().any().all()
    blank = pd.DataFrame([dict.fromkeys(["id", *FEATURES], None)])  # every feature missing

    champion = classified.champion(monkeypatch)
    answers = champion.predict(table)
    assert set(answers) <= set(TIERS)
    assert np.mean(answers == table["tier"].to_numpy()) > 0.6  # real answers, on rows it never saw
    assert champion.predict(blank)[0] in TIERS
    with pytest.raises(Exception, match=r"input row 1, column 'member': expected true or false"):
        champion.predict(table.head(1).assign(member="maybe"))

    split = json.loads(table.to_json(orient="split"))  # a blank is null, as a JSON caller sends it
    records = [dict(zip(split["columns"], row, strict=True)) for row in split["data"]]
    columns = {name: [record[name] for record in records] for name in split["columns"]}
    bodies = {
        "text/csv": raw.read_bytes(),
        "dataframe_split": json.dumps({"dataframe_split": split}),
        "dataframe_records": json.dumps({"dataframe_records": records}),
        "inputs": json.dumps({"inputs": columns}),
        "instances": json.dumps({"instances": records}),
    }
    log = tmp_path / "serve.log"
    with mlflow_models_serve(f"models:/{classified.name}@champion", classified.store, log) as url:
        served = {
            form: invoke(url, body if isinstance(body, bytes) else body.encode(), _content_type(form))
            for form, body in bodies.items()
        }
    for form, (status, text) in served.items():
        assert status == 200, (form, text[:2000])
        assert json.loads(text)["predictions"] == answers.tolist(), form


def _content_type(form: str) -> str:
    return "text/csv" if form == "text/csv" else "application/json"


def _drift(trained: Trained, current: Path, out: Path) -> tuple[str, dict]:
    tracking = f"sqlite:///{trained.root / 'drift.db'}"
    options = json.dumps({"label_column": trained.label, "key_column": "id"})
    code = training_main(
        ["drift", "--model-name", trained.name, "--task", "tabular", "--task-options", options,
         "--reference", str(trained.prepared), "--current", str(current), "--out", str(out), "--no-publish",
         "--mlflow-tracking-uri", tracking]
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "drift.json").read_text())
    runs = MlflowClient(tracking).search_runs(
        [experiment.experiment_id for experiment in MlflowClient(tracking).search_experiments()],
        filter_string=f"tags.`retrain.drift.check_id` = '{report['check_id']}'",
    )
    assert len(runs) == 1
    return runs[0].data.tags["retrain.drift.alert"], report


def test_a_shifted_city_share_raises_a_drift_alert_logged_to_mlflow(classified: Trained, tmp_path):
    alike = write_batches(tmp_path / "alike", [mixed_table(1500, 21, first_id=10**6)], "tier")
    shares = np.full(len(CITIES), 0.5 / (len(CITIES) - 1))
    shares[0] = 0.5  # half of the new rows from one city, where it was 1 in 50
    shifted = write_batches(
        tmp_path / "shifted", [mixed_table(1500, 22, first_id=10**6, city_shares=shares)], "tier"
    )

    quiet, quiet_report = _drift(classified, alike, tmp_path / "quiet")
    alert, report = _drift(classified, shifted, tmp_path / "alert")

    assert (quiet, quiet_report["alert"]) == ("false", False), quiet_report["drifted_features"]
    assert (alert, report["alert"]) == ("true", True)
    assert f"city={CITIES[0]}" in report["drifted_features"]
    named = {feature["name"] for feature in report["features"]}
    assert {"age", "age:missing", "member", "colour=red", "city=(missing)"} <= named


def test_a_regression_target_trains_as_well_as_gradient_boosting_and_serves_numbers(
    regressed: Trained, tmp_path, monkeypatch
):
    predicted, targets = _gradient_boosting(regressed, HistGradientBoostingRegressor)
    baseline = mean_absolute_error(targets, predicted)
    metrics = regressed.registration["metrics"]
    assert set(metrics) == {"mae", "rmse", "r2", "loss"}
    assert regressed.registration["decision"]["primary_metric"] == "rmse"
    assert metrics["mae"] <= 1.1 * baseline, (metrics["mae"], baseline)

    frame = mixed_table(200, 9, first_id=10**6, cities=[*CITIES[:10], "atlantis"])
    raw = write_batches(tmp_path / "new", [frame], "spend") / "batch-0001.csv"
    table = pd.read_csv(raw)
    answers = np.asarray(regressed.champion(monkeypatch).predict(table), dtype=np.float64)
    assert answers.shape == (len(table),) and np.isfinite(answers).all()
    assert mean_absolute_error(table["spend"], answers) < 2 * metrics["mae"]


def test_retrain_init_tabular_then_run_needs_no_code(tmp_path):
    environ = {name: value for name, value in os.environ.items() if not name.startswith("RETRAIN_")}
    environ["PYTHONPATH"] = str(REPO_ROOT)
    completed = subprocess.run(
        [sys.executable, "-m", "retrain_cli", "init", "churn", "--task", "tabular"],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert not list(tmp_path.rglob("*.py"))

    _, registration, output = retrain_run(
        tmp_path / ".retrain", tmp_path / "models", "--model-name", "churn",
        "--data", str(tmp_path / "landing" / "churn"), *QUICK,
    )  # fmt: skip
    assert registration["registered_version"] == "1", output
