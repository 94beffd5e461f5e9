"""`retrain run` end to end through the gate: a good data version registers, a degraded one is refused.

Real steps, real trainer, the real MLflow registry on SQLite in the state folder; only the data differs:
the second version is the same digits with half the labels wrong, as a broken upstream labeller makes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SMALL_TRAINING

import retrain_cli
from training.sample_data import write_sample_batches

# The small training, tracked in MLflow (so the gate's decision is also recorded on the candidate's run).
TRAINING = [
    *("--epochs", str(SMALL_TRAINING["epochs"])),
    *(
        arg
        for name, value in SMALL_TRAINING.items()
        if name not in ("epochs", "mlflow_tracking_uri")
        for arg in ("--param", f"{name}={value}")
    ),
]


def retrain(monkeypatch, capsys, state: Path, *argv: str) -> str:
    monkeypatch.setenv("RETRAIN_HOME", str(state))
    assert retrain_cli.main(list(argv)) == 0, capsys.readouterr().err[-3000:]
    return capsys.readouterr().out


def registration(output: str) -> dict:
    path = next(line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("registration: "))
    return json.loads((Path(path) / "registration.json").read_text())


@pytest.fixture(scope="module")
def degraded_raw(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("degraded") / "raw"
    write_sample_batches(raw, batches=4, label_noise=0.5)
    return raw


def test_a_good_data_version_registers_and_a_degraded_one_is_refused_with_reasons(
    monkeypatch, capsys, tmp_path, sample_raw, degraded_raw
):
    state = tmp_path / "state"
    first = registration(retrain(monkeypatch, capsys, state, "run", "--data", str(sample_raw), *TRAINING))
    assert first["decision"]["accepted"] is True, first["decision"]
    assert first["registered_version"] == "1"

    second = registration(retrain(monkeypatch, capsys, state, "run", "--data", str(degraded_raw), *TRAINING))
    assert second["decision"]["accepted"] is False
    assert second["registered_version"] is None
    reasons = " ".join(second["decision"]["reasons"])
    assert "accuracy" in reasons and "champion v1" in reasons, reasons

    listing = json.loads(retrain(monkeypatch, capsys, state, "models", "--model-name", "digits", "--json"))
    assert [(model["version"], model["aliases"]) for model in listing["versions"]] == [("1", ["champion"])]
    lineage = listing["versions"][0]["lineage"]
    assert lineage["raw_data_version"].startswith("rd-")
    assert lineage["environment_version"] == "1"
    assert lineage["pipeline_job"]
