"""MLflow tracking of a training run evicted and resumed as Azure ML jobs: each job's own run is tagged.

(Evicted and resumed locally, a training is one complete MLflow run: tests/test_demo.py asserts it on the
demo's evicted pipeline run.)"""

from __future__ import annotations

import signal

from helpers.training.run_outputs import read_metadata
from helpers.training.small_run import STEPS_PER_EPOCH
from helpers.training.training_process import is_step

from training.engine.preemption import PREEMPTED_EXIT_CODE
from training.mlflow_setup import mlflow_client

TWO_EPOCHS = ("--epochs", "2")  # three attempts of the small run; two epochs are enough to show it


def test_in_azure_ml_each_job_run_is_tagged_with_its_own_preemption(start_training, folders, tmp_path):
    """Azure ML gives each job an MLflow run (MLFLOW_RUN_ID): training continues the first, and every
    preempted job's own run carries the tag the pipeline submitter counts preemptions by."""
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow_client(tracking_uri)  # a fresh store from the schema template, as the steps open one
    experiment_id = client.create_experiment("jobs", artifact_location=(tmp_path / "artifacts").as_uri())
    job_runs = [client.create_run(experiment_id).info.run_id for _ in range(3)]
    tracking = ["--mlflow-tracking-uri", tracking_uri, "--mlflow-experiment", "jobs"]
    for job_run, step in zip(job_runs[:2], (20, 60), strict=True):
        process = start_training(nproc=1, tracking=tracking, extra=TWO_EPOCHS, env={"MLFLOW_RUN_ID": job_run})
        process.wait_for(is_step(step))
        process.send_signal(signal.SIGTERM)
        assert process.finish() == PREEMPTED_EXIT_CODE
    last = start_training(nproc=1, tracking=tracking, extra=TWO_EPOCHS, env={"MLFLOW_RUN_ID": job_runs[2]})
    assert last.finish() == 0

    first, second, third = (client.get_run(run_id) for run_id in job_runs)
    assert read_metadata(folders.out)["mlflow_run_id"] == first.info.run_id
    assert first.info.status == "FINISHED"
    loss_steps = sorted({metric.step for metric in client.get_metric_history(first.info.run_id, "loss")})
    assert loss_steps == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert int(second.data.tags["retrain.preempted_at_step"]) >= 60
    assert "retrain.preempted_at_step" not in third.data.tags
    assert len(client.search_runs([experiment_id])) == 3


def test_task_options_are_logged_as_json_and_cut_to_what_mlflow_accepts():
    from training.engine.tracking import MAX_PARAM_LENGTH, param_text

    assert param_text({"b": 1, "a": ["x"]}) == '{"a": ["x"], "b": 1}'
    assert param_text(3e-3) == "0.003"
    long = param_text({"feature_columns": [f"column_{index}" for index in range(2000)]})
    assert len(long) == MAX_PARAM_LENGTH and long.endswith("...")
