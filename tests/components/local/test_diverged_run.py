"""`retrain run` of a training that diverges (issue 14, item 4): the train step fails with the trainer's
documented code and its own reason, evaluate and register never run, and no model version is registered.

The loss goes wrong inside the real train step (torchrun and the worker), through a user's task whose
loss becomes infinite at a chosen step (tests/helpers/training/diverging_task.py).
"""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import pytest
from helpers.components.run_requests import SMALL_MODEL, SMALL_TRAINING

from components.local import LocalStepFailed, RunStore
from components.local import cli as local_cli
from components.local.launch import DIVERGED_EXIT_CODE, TorchrunReports, reported_reason
from components.model_config import MODELS_DIR_VARIABLE
from components.request import CANCELED, COMPLETED, FAILED
from components.specs import REPO_ROOT

TASK = f"{REPO_ROOT / 'tests' / 'helpers' / 'training' / 'diverging_task.py'}:DivergingTabular"


def test_a_diverged_training_fails_the_run_at_train_and_registers_nothing(tmp_path, sample_raw):
    state = tmp_path / "state"
    options = {**SMALL_MODEL, "diverge_at_step": 5}
    argv = ["run", "--data", str(sample_raw), "--model-name", "diverging", "--task", TASK]
    argv += ["--task-options", json.dumps(options), "--epochs", "1"]
    argv += [f"--param={name}={value}" for name, value in SMALL_TRAINING.items() if name != "epochs"]
    parser = argparse.ArgumentParser(prog="retrain")
    local_cli.register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.state_root = state
    args.environ = {**os.environ, MODELS_DIR_VARIABLE: str(tmp_path / "no-model-configs")}
    out = io.StringIO()

    with pytest.raises(LocalStepFailed) as failed:
        args.handler(args, out)

    print(out.getvalue())  # shown by pytest when the test fails
    assert failed.value.step_exit_code == DIVERGED_EXIT_CODE
    reason = "(training diverged at step 5: its loss is inf; "
    assert failed.value.headline.startswith(f"step 'train' failed with exit code 65 {reason}")
    # The run's line says where and why: the worker's own error line, the last thing its step's log says
    # (torchrun's ChildFailedError report no longer follows it).
    [said] = [line for line in out.getvalue().splitlines() if line.startswith("run ")]
    assert said.startswith(f"run {failed.value.run_id}: Failed at train: {reason[1:]}")
    # What the user sees (the run's lines, the failure with its log's tail): the reason, no traceback.
    shown = out.getvalue() + str(failed.value)
    assert "Traceback" not in shown and "ChildFailedError" not in shown, shown
    record = RunStore(state / "runs").list(limit=1)[0]
    assert (record.status, record.failed_step) == (FAILED, "train")
    assert {step.name: step.status for step in record.steps} == {
        "prep": COMPLETED, "train": FAILED, "evaluate": CANCELED, "register": CANCELED
    }  # fmt: skip
    assert len(record.step("train").attempts) == 1  # not restarted: it would diverge again
    assert sorted(path.name for path in (state / "runs" / record.run_id).iterdir() if path.is_dir()) == [
        "prep",
        "train",
    ]  # evaluate and register never started

    assert registered_versions(state, "diverging") == []


def registered_versions(state: Path, model_name: str) -> list[str]:
    """The versions of `model_name` in the local registry (MLflow's store in the state folder). Without a
    store, none: creating one only to ask would cost the test more than its training."""
    store = state / "mlflow.db"
    if not store.exists():
        return []
    from mlflow.tracking import MlflowClient

    found = MlflowClient(f"sqlite:///{store}").search_model_versions(f"name = '{model_name}'")
    return [version.version for version in found]


def test_the_reason_of_a_diverged_step_is_its_workers_own_first_line(tmp_path):
    reports = TorchrunReports.in_folder(tmp_path)
    assert reported_reason(reports, DIVERGED_EXIT_CODE) is None
    worker = reports.log_dir / "run_x" / "attempt_0" / "1" / "error.json"
    worker.parent.mkdir(parents=True)
    reason = {
        "message": "training diverged at step 5: its loss is inf\nmore",
        "errorCode": DIVERGED_EXIT_CODE,
    }
    worker.write_text(json.dumps({"message": reason}))
    assert reported_reason(reports, DIVERGED_EXIT_CODE) == "training diverged at step 5: its loss is inf"
    assert reported_reason(reports, 75) is None  # a report of another code does not speak for this one
    assert reported_reason(None, DIVERGED_EXIT_CODE) is None
    reports.error_file.write_text(json.dumps({"message": {**reason, "message": "from torchrun's copy"}}))
    assert reported_reason(reports, DIVERGED_EXIT_CODE) == "from torchrun's copy"
