"""Each model's MLflow runs in an experiment of its own, named as the model: two models' `retrain run`s on
one state folder land in two experiments, and each registered version's run is in its model's."""

from __future__ import annotations

from helpers.components.run_harness import retrain_run

from training.gate.registry import resolve_store
from training.mlflow_setup import mlflow_client

# A small training, tracked (MLflow on: the state folder's SQLite store).
TRACKED = [
    "--task", "tabular", "--task-option", "hidden_width=64", "--epochs", "2",
    "--param", "global_batch_size=32", "--param", "checkpoint_every_seconds=off",
]  # fmt: skip


def test_two_models_runs_land_in_two_experiments_named_as_the_models(tmp_path, sample_raw, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the state folder's own store
    state, models = tmp_path / "state", tmp_path / "no-model-configs"
    records = {
        name: retrain_run(state, models, "--model-name", name, "--data", str(sample_raw), *TRACKED)[0]
        for name in ("alpha", "beta")
    }

    client = mlflow_client(resolve_store(None, {}, state).tracking_uri)
    experiments = {experiment.name: experiment.experiment_id for experiment in client.search_experiments()}
    runs = {name: client.search_runs([experiments[name]]) for name in ("alpha", "beta")}
    assert [len(runs["alpha"]), len(runs["beta"])] == [1, 1]  # each model's training run, in its own
    assert "retrain" not in experiments  # the one experiment every model once shared
    for name, record in records.items():
        (run,) = runs[name]
        version = client.get_model_version(name, "1")
        assert version.run_id == run.info.run_id  # registered from the training run in its experiment
        assert run.data.metrics["test_macro_f1"] >= 0  # the evaluate step logged into that same run
        for step in ("train", "register"):
            command = record.step(step).command
            assert command[command.index("--mlflow-experiment") + 1] == name
