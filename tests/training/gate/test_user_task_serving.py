"""A user's own task's champion takes what its users have (issue 41): the house-price regression of
tests/helpers/training/houses_task.py, whose whole-number columns (`bedrooms`, `sqft`) it trains on and
returns in its input example as float64, as a task that trains on floats naturally does.

Registered through the step commands, the champion answers `pandas.read_csv` of a raw file (where those
columns read as int64, which MLflow refuses into a double column) in Python, and the same file as a
`text/csv` body and as every JSON form of MLflow's scoring protocol under the real `mlflow models serve`.
A decimal in a column the training data holds only whole numbers in is refused, as for the built-in task.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
from helpers.training.houses_task import NUMBERS, TEXT, HousePrices, write_houses
from helpers.training.model_server import invoke, mlflow_models_serve
from mlflow.exceptions import MlflowException

from training.cli import main
from training.gate.pyfunc_model import predict, served_example
from training.gate.register import REGISTRATION_FILE
from training.gate.registry import CHAMPION, MlflowStore, ModelRegistry

TASK_SOURCE = Path(__file__).parents[2] / "helpers" / "training" / "houses_task.py"
MODEL = "houses"
TRAIN = [
    *("--epochs", "20", "--learning-rate", "0.05", "--warmup-steps", "0", "--global-batch-size", "32"),
    *("--seed", "3", "--progress", "none", "--no-mlflow", "--checkpoint-every-steps", "off"),
]


class Champion:
    """One champion of the houses task, trained and registered once for the module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.task = f"{root / 'user' / 'houses_task.py'}:HousePrices"
        self.data, self.model = root / "prepared", root / "model"
        self.raw_file = write_houses(root / "raw", rows=400, seed=0)
        self.tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
        self.registry = ModelRegistry(MlflowStore(self.tracking_uri, (root / "mlartifacts").as_uri()))

    def run(self, *argv: str) -> None:
        assert main(list(argv)) == 0, argv

    def register(self) -> dict:
        (self.root / "user").mkdir()
        shutil.copy(TASK_SOURCE, self.root / "user" / "houses_task.py")
        task, data = ("--task", self.task), ("--data", str(self.data))
        store = ("--model-name", MODEL, "--mlflow-tracking-uri", self.tracking_uri)
        model = ("--model", str(self.model))
        evaluation, out = self.root / "evaluation", self.root / "registration"
        self.run("prepare", *task, "--raw", str(self.raw_file.parent), "--out", str(self.data))
        self.run(
            "train", *task, *data, "--out", str(self.model), "--checkpoints", str(self.root / "ck"), *TRAIN
        )
        self.run("evaluate", *task, *store, *model, *data, "--out", str(evaluation))
        self.run(
            *("register", *task, *store, *model, *data, "--evaluation", str(evaluation), "--out", str(out)),
            *("--raw-data-version", "rd-00000000000000cc", "--environment-version", "1"),
            *("--lock", str(self.root / "locks")),
        )
        return json.loads((out / REGISTRATION_FILE).read_text())


@pytest.fixture(scope="module")
def champion(tmp_path_factory: pytest.TempPathFactory) -> Champion:
    champion = Champion(tmp_path_factory.mktemp("houses"))
    record = champion.register()
    assert (record["decision"]["accepted"], record["registered_version"]) == (True, "1")
    return champion


def _expected(champion: Champion, table: pd.DataFrame) -> list[float]:
    return predict(champion.registry.load_model(champion.registry.version(MODEL, "1")), table).tolist()


def test_the_champion_answers_pandas_read_csv_of_its_raw_file_whole_number_columns_included(
    champion: Champion, monkeypatch
):
    table = pd.read_csv(champion.raw_file)  # the price too, which the model ignores
    assert {name: table[name].dtype.kind for name in (*NUMBERS, TEXT)} == {
        "bedrooms": "i",
        "sqft": "i",
        "lot_acres": "f",
        "description": "O",
    }
    monkeypatch.setenv("MLFLOW_TRACKING_URI", champion.tracking_uri)
    served = mlflow.pyfunc.load_model(f"models:/{MODEL}@{CHAMPION}")

    answers = served.predict(table)

    assert np.allclose(answers, _expected(champion, table))
    assert np.abs(answers - table["price"].to_numpy()).mean() < 0.5  # real answers, of a real fit
    columns = {spec.name: spec.type.name for spec in served.metadata.get_input_schema().inputs}
    assert columns == {"bedrooms": "long", "sqft": "long", "lot_acres": "double", "description": "string"}
    # A decimal where the training data holds only whole numbers is refused, naming the column.
    decimal = table.astype({"bedrooms": "float64"})
    decimal.loc[0, "bedrooms"] = 2.5
    with pytest.raises(MlflowException, match="Incompatible input types for column bedrooms"):
        served.predict(decimal)


def test_mlflow_models_serve_answers_the_raw_file_as_a_csv_body_and_as_every_json_form(
    champion: Champion, tmp_path: Path
):
    table = pd.read_csv(champion.raw_file)
    expected = _expected(champion, table)
    records = table.to_dict(orient="records")
    bodies = {
        "text/csv": champion.raw_file.read_bytes(),
        "dataframe_split": json.dumps({"dataframe_split": json.loads(table.to_json(orient="split"))}),
        "dataframe_records": json.dumps({"dataframe_records": records}),
        "inputs": json.dumps({"inputs": table.to_dict(orient="list")}),
        "instances": json.dumps({"instances": records}),
    }
    decimal = table.astype({"sqft": "float64"})
    decimal.loc[0, "sqft"] = 1200.5

    model_uri = f"models:/{MODEL}@{CHAMPION}"
    with mlflow_models_serve(model_uri, champion.tracking_uri, tmp_path / "serve.log") as url:
        answers = {
            form: invoke(url, body, "text/csv")
            if isinstance(body, bytes)
            else invoke(url, body.encode(), "application/json")
            for form, body in bodies.items()
        }
        refused = invoke(url, decimal.to_csv(index=False).encode(), "text/csv")

    for form, (status, text) in answers.items():
        assert status == 200, (form, text[:2000])
        assert np.allclose(json.loads(text)["predictions"], expected), form
    status, text = refused
    position = list(decimal.columns).index("sqft")  # MLflow's CSV parser names a column by its position
    assert status == 400 and f"for float64 dtyped data in column {position}'" in text, text[:2000]


class UnreadableReference(HousePrices):
    def drift_features(self, source: Path, *, prepared: bool):
        raise OSError(f"{source}: the reference is on a disk that went away")


def test_a_column_is_served_as_whole_numbers_only_where_the_training_data_says_so(champion: Champion, caplog):
    task, data = HousePrices(), HousePrices().load(champion.data)
    typed = served_example(task, data, champion.data)
    assert {name: typed[name].dtype.kind for name in (*NUMBERS, TEXT)} == {
        "bedrooms": "i",
        "sqft": "i",
        "lot_acres": "f",
        "description": "O",
    }
    assert typed.astype({"bedrooms": "float64", "sqft": "float64"}).equals(task.input_example(data))

    # A decimal in the example's rows: the column is not whole, whatever the training split holds.
    data.split("test").rows.loc[0, "bedrooms"] = 2.5
    assert served_example(task, data, champion.data)["bedrooms"].dtype.kind == "f"

    # A reference that cannot be read leaves the example's own types, and says why, once.
    caplog.set_level(logging.WARNING, logger="training.gate.pyfunc_model")
    kept = served_example(UnreadableReference(), HousePrices().load(champion.data), champion.data)
    assert {name: kept[name].dtype.kind for name in NUMBERS} == dict.fromkeys(NUMBERS, "f")
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "the reference is on a disk that went away" in warnings[0], warnings
    assert "task 'house-prices'" in warnings[0] and "served as decimals" in warnings[0]
