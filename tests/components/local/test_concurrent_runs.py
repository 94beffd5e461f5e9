"""Runs at once on one state folder: each training keeps its own checkpoints, and none races another.

Two `retrain run`s of one data version with other epochs once shared a checkpoint folder (the run key's):
the 3-epoch run resumed the 6-epoch run's step 75 and kept that as its model. And two runs on a fresh state
folder raced on setting up MLflow's SQLite store. Now the checkpoints of a run live under its checkpoint
key (the run key and the options that decide the training), locally and on Azure ML; a run that would
write the folder of a run in progress waits for it; MLflow's store is set up once, under a lock.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.components.quick_pipeline import QuickPipeline, QuickRequest
from helpers.components.run_requests import SMALL_MODEL
from helpers.components.task_file import write_task_file

from components.azureml.builder import PipelineBuild
from components.checkpoint_key import checkpoint_key
from components.local import LocalRunner, RunnerOptions, RunRecord, RunStore
from components.local.plan import durable_path
from components.model_config import MODELS_DIR_VARIABLE
from components.request import COMPLETED, DataRef, RunRequest
from components.specs import REPO_ROOT, load_pipeline_spec
from core.trajectory import TRAJECTORY_FIELDS
from training.engine.config import TrainConfig
from training.local_state import STATE_DIR_VARIABLE

VERSION = "rd-0123456789abcdef"
PIPELINE = load_pipeline_spec()
STEPS_PER_EPOCH = 44  # 1421 training rows / a global batch of 32


def _request(parameters: dict[str, Any] | None = None, **changes: Any) -> RunRequest:
    fields: dict[str, Any] = {
        "model_name": "digits",
        "data": DataRef(VERSION, f"azureml:digits-raw:{VERSION}"),
        "parameters": parameters or {},
    }
    return RunRequest(**{**fields, **changes})


def _local_folder(request: RunRequest) -> str:
    train = PIPELINE.steps["train"]
    return str(durable_path(Path("/state"), PIPELINE, train, "checkpoints", request))


def _azure_path(request: RunRequest) -> str:
    return PipelineBuild.for_request(request).checkpoints_path


@pytest.mark.parametrize("where", [_local_folder, _azure_path], ids=["local", "azure"])
def test_checkpoints_are_kept_per_training_of_a_run_key(where: Callable[[RunRequest], str], tmp_path):
    three = where(_request({"epochs": 3, "checkpoint_every_steps": 10}))
    assert f"digits-{VERSION}-" in three

    # Other epochs, or anything else that decides the training, is another folder.
    assert where(_request({"epochs": 6, "checkpoint_every_steps": 10})) != three
    for other in (
        _request({"epochs": 3, "seed": 1}),
        _request({"epochs": 3, "global_batch_size": 128}),
        _request({"epochs": 3, "learning_rate": 0.01}),
        _request({"epochs": 3}, task_options=SMALL_MODEL),
        _request({"epochs": 3}, model_name="digits-b"),
    ):
        assert where(other) != three

    # What a resume may change keeps the folder: the checkpoint interval, evictions, processes, trigger.
    resumable = _request(
        {"epochs": "3", "checkpoint_every_steps": 25, "checkpoint_every_seconds": "auto", "mtbe_hours": 2.0},
        processes_per_instance=4,
        instance_count=2,
        trigger={"source": "http"},
    )
    assert where(resumable) == three
    # Values count as the step receives them: pipeline.yml's default of 5 epochs is `--epochs 5`.
    assert where(_request()) == where(_request({"epochs": 5}))

    # A task file's content decides its model: changing the file is another training.
    task_file = write_task_file(tmp_path / "tasks")
    before = where(_request(task=f"{task_file}:Flowers"))
    task_file.write_text(task_file.read_text() + "\n# another model\n")
    assert where(_request(task=f"{task_file}:Flowers")) != before


def test_the_checkpoint_key_changes_with_every_trajectory_input_of_the_train_step_and_no_other():
    # The one list names the trainer's options a checkpoint resumes only under, and the train step's inputs
    # of the same names: each that the step declares moves the key, and no other input does.
    assert set(TRAJECTORY_FIELDS) <= set(TrainConfig.__dataclass_fields__)
    train = PIPELINE.steps["train"]
    before = checkpoint_key(PIPELINE, "train", _request())
    changed = {"task": "image", "task_options": SMALL_MODEL, "checkpoint_every_seconds": "60"}
    moved, kept = set(), set()
    for name, port in train.component.inputs.items():
        if port.type not in ("string", "integer", "number"):
            continue  # data: its version is the run key's
        value = changed.get(name, 7 if port.type == "integer" else 0.5)
        if name in ("task", "task_options"):  # the request's own fields, not parameters
            after = checkpoint_key(PIPELINE, "train", _request(**{name: value}))
        else:
            after = checkpoint_key(PIPELINE, "train", _request({name: value}))
        (moved if after != before else kept).add(name)
    assert moved == set(TRAJECTORY_FIELDS) & set(train.component.inputs)
    assert {"epochs", "seed", "task", "task_options"} <= moved
    assert {"checkpoint_every_seconds", "mtbe_hours", "checkpoint_every_steps"} <= kept


# -- one durable folder, one run at a time: the quick pipeline in threads -----------------------------------


class _Progress(io.StringIO):
    """A runner's progress lines, and an event set when it says it waits."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def write(self, text: str) -> int:
        if " waiting for " in text:
            self.waiting.set()
        return super().write(text)


def _runner(quick: QuickPipeline, state: Path, progress: io.StringIO, **hooks: Any) -> LocalRunner:
    options = RunnerOptions(
        state_root=state, pipeline_file=quick.pipeline_file, environment_file=quick.environment_file
    )
    return LocalRunner(options, os.environ, progress, **hooks)


def _in_thread(run: Callable[[], RunRecord], results: dict[str, Any], name: str) -> threading.Thread:
    def target() -> None:
        try:
            results[name] = run()
        except BaseException as error:  # reported by the test, not lost in the thread
            results[name] = error

    thread = threading.Thread(target=target, name=name)
    thread.start()
    return thread


def test_a_run_of_the_same_training_waits_for_the_one_in_progress_and_other_runs_go_on(
    quick_pipeline: QuickPipeline, quick_request: QuickRequest, tmp_path
):
    state = tmp_path / "state"
    started, release = threading.Event(), threading.Event()

    def hold_first_step(step: str, attempt: int, pid: int) -> None:
        started.set()
        release.wait(120)  # the first run holds its folders until the test has seen the second wait

    request, results = quick_request(), {}
    first = _in_thread(
        lambda: _runner(quick_pipeline, state, io.StringIO(), on_process_started=hold_first_step).run(
            request
        ),
        results,
        "first",
    )
    try:
        assert started.wait(120), "the first run started no step"
        [first_record] = RunStore(state / "runs").list()
        waiting = _Progress()
        second = _in_thread(lambda: _runner(quick_pipeline, state, waiting).run(request), results, "second")
        assert waiting.waiting.wait(120), "the second run did not wait"
        line = waiting.getvalue().splitlines()[0]
        assert f"waiting for run {first_record.run_id} (pid {os.getpid()}) to end" in line
        assert len(RunStore(state / "runs").list()) == 1  # the waiting run has not begun

        # Another data version is another run key, so other checkpoints: it runs meanwhile.
        other_raw = tmp_path / "other-raw"
        other_raw.mkdir()
        (other_raw / "batch-1.csv").write_text("5\n")
        other = _runner(quick_pipeline, state, io.StringIO()).run(quick_request(other_raw))
        assert other.status == COMPLETED and first.is_alive()
    finally:
        release.set()
        first.join(120)
    second.join(120)

    done, after = results["first"], results["second"]
    assert isinstance(done, RunRecord) and done.status == COMPLETED, done
    assert isinstance(after, RunRecord) and after.status == COMPLETED, after
    # It started once the first had ended, and reused every step the first had just made.
    assert {step.name: step.reused for step in after.steps} == {"make": True, "double": True, "finish": True}
    assert after.outputs == done.outputs


# -- two real `retrain run`s at once on a fresh state folder ---------------------------------------------


def _retrain_run(home: Path, raw: Path, epochs: int) -> subprocess.Popen[str]:
    options = ["--task", "tabular", "--epochs", str(epochs)]
    options += ["--task-option", f"hidden_width={SMALL_MODEL['hidden_width']}"]
    for name, value in {"global_batch_size": 32, "checkpoint_every_steps": 10}.items():
        options += ["--param", f"{name}={value}"]
    environ = {
        **os.environ,
        STATE_DIR_VARIABLE: str(home),
        MODELS_DIR_VARIABLE: str(home.parent / "no-model-configs"),
        "PYTHONPATH": str(REPO_ROOT),
    }
    environ.pop("MLFLOW_TRACKING_URI", None)  # the state folder's own SQLite store, fresh
    return subprocess.Popen(
        [sys.executable, "-m", "retrain_cli", "run", "--data", str(raw), *options],
        cwd=REPO_ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_two_runs_at_once_on_a_fresh_home_complete_each_with_its_own_epochs(sample_raw, tmp_path):
    home = tmp_path / "home"
    processes = {epochs: _retrain_run(home, sample_raw, epochs) for epochs in (1, 2)}
    outputs = {epochs: process.communicate(timeout=600)[0] for epochs, process in processes.items()}
    for epochs, process in processes.items():
        assert process.returncode == 0, outputs[epochs][-4000:]

    records = RunStore(home / "runs").list()
    assert len(records) == 2 and all(record.status == COMPLETED for record in records)
    by_epochs = {}
    for record in records:
        for step in record.steps:
            if step.reused:  # made by whichever run got there first, which ran it and holds its log
                assert step.log is None and step.cache_key
                continue
            log = Path(step.log).read_text()
            assert "Traceback" not in log, f"{step.name} of run {record.run_id}:\n{log[-3000:]}"
        metadata = json.loads((Path(record.step("train").outputs["model"]) / "metadata.json").read_text())
        by_epochs[metadata["config"]["epochs"]] = (record, metadata)
    assert sorted(by_epochs) == [1, 2]
    for epochs, (_, metadata) in by_epochs.items():
        assert (metadata["steps"], metadata["resumes"]) == (epochs * STEPS_PER_EPOCH, 0)
        assert metadata["final_metrics"]["train_loss"] is not None  # it trained, not took a finished run over
        assert metadata["mlflow_run_id"]  # tracked in the one store both set up at once
    (one, _), (two, _) = by_epochs[1], by_epochs[2]
    assert one.step("train").outputs["checkpoints"] != two.step("train").outputs["checkpoints"]
    assert one.step("train").cache_key != two.step("train").cache_key
