"""A train-step failure says the worker's own reason in one line (issue 20, item 10): a task that breaks its
contract is named with the method and what it must return, and under torchrun the reason travels in
torchelastic's error file (training/engine/failure_report.py) to the launcher, never as torchrun's
ChildFailedError traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.engine import worker
from training.engine.failure_report import ELASTIC_ERROR_FILE_VARIABLE, read_report
from training.engine.preemption import LAUNCH_ID_VARIABLE
from training.mlflow_setup import mlflow_client

TASKS = Path(__file__).parents[2] / "helpers" / "training" / "broken_tasks.py"
NO_TRACEBACK = ("Traceback", "ChildFailedError")


def test_a_contract_broken_under_torchrun_is_one_line_from_the_error_file(start_training, folders):
    process = start_training(nproc=2, extra=["--task", f"{TASKS}:VectorLoss", "--epochs", "1"])

    assert process.finish() == 2
    output = (folders.logs / "attempt-1.log").read_text()
    errors = [line for line in output.splitlines() if line.startswith("retrain: error:")]
    assert errors == [
        "retrain: error: task 'vector-loss': loss() returned a shape [16] float32 tensor; it must return the "
        "batch's loss as one number: a 0-dim float tensor, e.g. the .mean() of per-sample losses "
        "(training/tasks/base.py)"
    ]  # printed once, by the launcher: not by each worker as well
    assert not any(word in output for word in NO_TRACEBACK), output


def _worker_main(prepared_data: Path, tmp_path: Path, task: str) -> int:
    return worker.main([
        "--data", str(prepared_data), "--out", str(tmp_path / "out"), "--checkpoints", str(tmp_path / "ckpt"),
        "--task", f"{TASKS}:{task}", "--epochs", "1", "--global-batch-size", "32", "--no-mlflow",
        "--checkpoint-every-seconds", "off", "--progress", "none",
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("task", "line"),
    [
        ("FunctionModel", "task 'function-model': build_model() returned a function; it must return a torch"),
        ("VectorLoss", "task 'vector-loss': loss() returned a shape [32] float32 tensor; it must return"),
    ],
)
def test_a_worker_names_the_broken_method_in_its_report_and_one_line(
    prepared_data, tmp_path, capsys, monkeypatch, task, line
):
    error_file = tmp_path / "reports" / "error.json"
    monkeypatch.setenv(ELASTIC_ERROR_FILE_VARIABLE, str(error_file))
    monkeypatch.delenv(LAUNCH_ID_VARIABLE, raising=False)

    assert _worker_main(prepared_data, tmp_path, task) == 2
    err = capsys.readouterr().err
    assert [text for text in err.splitlines() if text.strip()] == [
        text for text in err.splitlines() if text.startswith("retrain: error: ")
    ] and f"retrain: error: {line}" in err
    report = read_report(error_file)
    assert report is not None and report.code == 2 and report.message.startswith(line)
    assert not (tmp_path / "out").exists()


def test_a_crash_is_one_line_for_the_user_and_its_traceback_is_kept_in_the_report(
    prepared_data, tmp_path, capsys, monkeypatch
):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv(ELASTIC_ERROR_FILE_VARIABLE, str(error_file))
    monkeypatch.setenv(LAUNCH_ID_VARIABLE, "launch-1")  # a `retrain train` above prints the line

    assert _worker_main(prepared_data, tmp_path, "CrashingLoss") == 1
    assert not any(word in capsys.readouterr().err for word in NO_TRACEBACK)
    report = json.loads(error_file.read_text())["message"]
    assert report["errorCode"] == 1
    assert report["message"] == "training failed on rank 0: KeyError: 'los'"
    assert "broken_tasks.py" in report["extraInfo"]["py_callstack"]  # where the task went wrong


def test_a_crash_ends_the_training_s_mlflow_run_failed_not_running(prepared_data, tmp_path, monkeypatch):
    monkeypatch.setenv(ELASTIC_ERROR_FILE_VARIABLE, str(tmp_path / "error.json"))
    monkeypatch.setenv(LAUNCH_ID_VARIABLE, "launch-1")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    code = worker.main([
        "--data", str(prepared_data), "--out", str(tmp_path / "out"), "--checkpoints", str(tmp_path / "ckpt"),
        "--task", f"{TASKS}:CrashingLoss", "--epochs", "1", "--global-batch-size", "32",
        "--mlflow-tracking-uri", uri, "--mlflow-experiment", "crashes",
        "--checkpoint-every-seconds", "off", "--progress", "none",
    ])  # fmt: skip

    assert code == 1
    client = mlflow_client(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("crashes").experiment_id])
    assert run.info.status == "FAILED" and run.info.end_time is not None
    assert run.data.params["task"] == f"{TASKS}:CrashingLoss"  # the run the crashed attempt started
