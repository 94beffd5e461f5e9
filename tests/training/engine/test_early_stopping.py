"""Validation's rules as functions: when a step is validated, what improves, when a run stops, which metric a
task lets it stop on, how the state rides in a checkpoint, and which options a resume must keep.
The whole of it runs once, end to end, in test_early_stopping_run.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from components.checkpoint_key import checkpoint_key, trajectory_values
from components.request import DataRef, RunRequest
from components.specs import load_pipeline_spec
from core.errors import InputError
from core.metrics import Metric, MetricSet
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.estimate import PER_TENSOR_OVERHEAD_BYTES, estimate_checkpoint_bytes
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import CheckpointMeta
from training.engine.config import TrainConfig, trajectory_mismatches
from training.engine.early_stopping import (
    SelectionRule,
    ValidationState,
    due,
    observe,
    selection_rule,
)
from training.engine.train_state import RunState, build_training_objects, checkpoint_state, restore
from training.engine.validation import rule_for
from training.tasks.loader import load_task

METRICS = MetricSet(
    (
        Metric("accuracy", "higher"),
        Metric("loss", "lower"),
        Metric("recall_*", "higher"),
    )
)


def _config(tmp_path: Path, **options) -> TrainConfig:
    return TrainConfig(data=tmp_path, out=tmp_path / "out", checkpoints=str(tmp_path / "ckpt"), **options)


# -- when ---------------------------------------------------------------------------------------------


def _due_steps(every_epochs=None, every_steps=None, total=30, per_epoch=10) -> list[int]:
    return [
        step
        for step in range(1, total + 1)
        if due(
            step,
            total_steps=total,
            steps_per_epoch=per_epoch,
            every_epochs=every_epochs,
            every_steps=every_steps,
        )
    ]


def test_validation_is_due_at_its_cadence_and_at_the_last_step():
    assert _due_steps(every_epochs=1) == [10, 20, 30]
    assert _due_steps(every_epochs=2) == [20, 30]  # the last step, though epoch 3 is not a second epoch
    assert _due_steps(every_steps=7) == [7, 14, 21, 28, 30]
    assert _due_steps(every_epochs=2, every_steps=15) == [15, 20, 30]  # either cadence
    assert _due_steps() == []  # validation off: not even the last step


# -- what improves, when a run stops ------------------------------------------------------------------


def test_an_improvement_beats_the_best_by_more_than_min_delta_in_the_metric_direction():
    lower = SelectionRule("validation_loss", higher=False, patience=2, min_delta=0.1)
    assert lower.improves(1.0, None)  # the first finite value
    assert lower.improves(0.85, 1.0) and not lower.improves(0.95, 1.0) and not lower.improves(0.9, 1.0)
    higher = SelectionRule("validation_accuracy", higher=True, patience=2)
    assert higher.improves(0.51, 0.5) and not higher.improves(0.5, 0.5) and not higher.improves(0.4, 0.5)
    for rule in (lower, higher):
        assert not rule.improves(math.nan, None) and not rule.improves(math.inf, 1.0)


def _run(rule: SelectionRule, losses: list[float]) -> ValidationState:
    state = ValidationState()
    for number, loss in enumerate(losses, start=1):
        assert not state.stopped, f"validated after stopping at {state.stopped_at}"
        state = observe(
            state, rule, number * 10, {"validation_loss": loss, "validation_accuracy": -loss}
        ).state
    return state


def test_the_run_stops_at_the_patience_th_validation_without_improvement_and_keeps_the_best():
    rule = SelectionRule("validation_loss", higher=False, patience=2)
    state = _run(rule, [2.0, 1.5, 1.6, 1.4, 1.45, 1.5])
    # 1.6 did not improve, 1.4 did (the count starts over), then two in a row did not: stop at the sixth.
    assert (state.best_step, state.best_value, state.stopped_at, state.since_best) == (40, 1.4, 60, 2)
    assert state.best_metrics == {"validation_loss": 1.4, "validation_accuracy": -1.4}
    assert (state.validations, state.last_step) == (6, 60)


def test_a_value_that_is_not_finite_counts_against_the_patience_and_never_becomes_the_best():
    state = _run(SelectionRule("validation_loss", higher=False, patience=2), [1.0, math.nan, math.inf])
    assert (state.best_step, state.best_value, state.stopped_at) == (10, 1.0, 30)


def test_a_selection_rule_without_patience_picks_the_best_and_never_stops():
    state = _run(SelectionRule("validation_loss", higher=False, patience=None), [1.0, 2.0, 3.0, 4.0])
    assert (state.best_step, state.stopped_at, state.since_best) == (10, None, 3)


# -- which metric -------------------------------------------------------------------------------------


def test_the_metric_and_its_direction_come_from_the_task():
    assert selection_rule(METRICS, "t", "accuracy", "validation_loss", 2, 0.0) == SelectionRule(
        "validation_loss", False, 2, 0.0
    )
    assert selection_rule(METRICS, "t", "accuracy", "validation_recall_3", 4, 0.5).higher  # a family member
    # No early stopping: the task's default primary metric picks the best, and never stops the run.
    assert selection_rule(METRICS, "t", "accuracy", None, 3, 0.0) == SelectionRule(
        "validation_accuracy", True, None
    )


def test_a_metric_the_task_does_not_declare_is_refused_in_one_line_naming_the_flag():
    with pytest.raises(InputError) as raised:
        selection_rule(METRICS, "tabular", "accuracy", "validation_f2", 2, 0.0)
    assert str(raised.value) == (
        "--early-stopping-metric validation_f2: task 'tabular' does not report it; expected one of "
        "validation_accuracy, validation_loss, validation_recall_*"
    )


def test_the_launcher_refuses_an_undeclared_metric_before_any_process_starts(tmp_path):
    from training.engine.launch import launch

    config = _config(tmp_path, validate_every_epochs=1, early_stopping_metric="validation_perplexity")
    with pytest.raises(InputError, match=r"^--early-stopping-metric validation_perplexity: task 'tabular'"):
        launch(config, nproc=2, environ={})
    assert not (tmp_path / "ckpt").exists()  # nothing started: not even the checkpoint location


def test_a_class_s_metric_beyond_the_classes_the_options_fix_is_refused_before_any_process_starts(tmp_path):
    from training.engine.launch import launch

    three = {"classes": ["setosa", "versicolor", "virginica"]}
    config = _config(
        tmp_path, task_options=three, validate_every_epochs=1, early_stopping_metric="validation_recall_3"
    )
    with pytest.raises(InputError) as raised:
        launch(config, nproc=2, environ={})
    assert str(raised.value) == (
        "--early-stopping-metric validation_recall_3: task 'tabular' does not report it; expected one of "
        "validation_accuracy, validation_macro_f1, validation_loss, validation_recall_*"
    )
    assert not (tmp_path / "ckpt").exists()  # nothing started: not even the checkpoint location
    # The last class's recall is one it reports.
    task = load_task("tabular", three)
    assert rule_for(_config(tmp_path, task_options=three, validate_every_epochs=1,
                            early_stopping_metric="validation_recall_2"), task).higher  # fmt: skip


def test_a_class_s_metric_the_validation_split_lacks_fails_naming_the_flag_not_the_task(
    prepared_data, tmp_path, capsys
):
    # Only the data fixes the digits' classes here (no n_classes option): the pre-run check reads them from
    # the raw files (tests/components/test_preflight.py); `retrain train` alone has the prepared split.
    from training.cli import main

    argv = ["train", "--data", str(prepared_data), "--out", str(tmp_path / "out")]
    argv += ["--checkpoints", str(tmp_path / "ckpt"), "--epochs", "1", "--global-batch-size", "64"]
    argv += ["--checkpoint-every-seconds", "off", "--no-mlflow", "--progress", "none"]
    argv += ["--validate-every-epochs", "1", "--early-stopping-metric", "validation_recall_99"]
    capsys.readouterr()

    assert main(argv) != 0

    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        "retrain: error: --early-stopping-metric 'validation_recall_99': the validation split at step 22 "
        "gave no 'recall_99' (a class it does not hold, or one the model does not have); expected a metric "
        "every validation reports, such as validation_macro_f1"
    ]
    assert not (tmp_path / "out" / "model.pt").exists()


# -- the options --------------------------------------------------------------------------------------


def test_early_stopping_and_a_best_candidate_need_validation(tmp_path):
    with pytest.raises(InputError, match=r"^--early-stopping-metric validation_loss: needs validation; add"):
        _config(tmp_path, early_stopping_metric="validation_loss")
    with pytest.raises(InputError, match=r"^--candidate best: needs validation"):
        _config(tmp_path, candidate="best")
    assert _config(tmp_path).candidate_kind == "last"
    assert _config(tmp_path, validate_every_steps=5).candidate_kind == "best"  # auto: best with validation
    assert _config(tmp_path, validate_every_steps=5, candidate="last").candidate_kind == "last"
    zero = _config(tmp_path, validate_every_epochs=0, validate_every_steps=0)
    assert (zero.validate_every_epochs, zero.validate_every_steps, zero.validates) == (None, None, False)


def test_a_resume_keeps_the_validation_options_and_a_checkpoint_from_before_them_resumes_with_defaults(
    tmp_path,
):
    plain = _config(tmp_path)
    older = {name: value for name, value in plain.trajectory().items() if "stopping" not in name}
    older = {name: value for name, value in older.items() if not name.startswith("validate")}
    assert trajectory_mismatches(older, plain) == []
    stopping = _config(tmp_path, validate_every_epochs=1, early_stopping_metric="validation_loss")
    assert trajectory_mismatches(older, stopping) == [
        "--validate-every-epochs 1 (checkpoint: None)",
        "--early-stopping-metric validation_loss (checkpoint: None)",
    ]
    patient = _config(
        tmp_path, validate_every_epochs=1, early_stopping_metric="validation_loss", early_stopping_patience=5
    )
    assert trajectory_mismatches(stopping.trajectory(), patient) == [
        "--early-stopping-patience 5 (checkpoint: 3)"
    ]
    # Which weights become the model is not the trajectory: the best are kept whenever validation is on.
    last = _config(
        tmp_path, validate_every_epochs=1, early_stopping_metric="validation_loss", candidate="last"
    )
    assert trajectory_mismatches(stopping.trajectory(), last) == []


def test_unset_validation_inputs_leave_a_runs_checkpoint_key_as_it_was_and_set_ones_move_it():
    pipeline = load_pipeline_spec()
    data = DataRef("rd-a1b2c3d4e5f60718", "azureml:digits-raw:1")
    plain = RunRequest(model_name="digits", data=data, trigger={"source": "manual"})
    assert not {"validate_every_epochs", "early_stopping_metric"} & set(
        trajectory_values(pipeline, "train", plain)
    )
    stopping = RunRequest(
        model_name="digits",
        data=data,
        trigger={"source": "manual"},
        parameters={"validate_every_epochs": "1", "early_stopping_metric": "validation_loss"},
    )
    values = trajectory_values(pipeline, "train", stopping)
    assert (values["validate_every_epochs"], values["early_stopping_metric"]) == ("1", "validation_loss")
    assert checkpoint_key(pipeline, "train", stopping) != checkpoint_key(pipeline, "train", plain)


# -- in the checkpoint --------------------------------------------------------------------------------


def test_the_validation_state_and_the_best_weights_ride_in_every_checkpoint_past_keep_two(tmp_path):
    config = _config(tmp_path, validate_every_epochs=1)
    task = load_task("tabular", {"hidden_width": 8})
    info = {
        "n_features": 2, "n_classes": 3, "feature_columns": ["a", "b"], "feature_mean": [0.0, 0.0],
        "feature_std": [1.0, 1.0], "classes": None,
    }  # fmt: skip
    objects = build_training_objects(config, task, info, total_steps=10, device=torch.device("cpu"))
    best = {name: tensor.clone() + 1 for name, tensor in objects.model.state_dict().items()}
    validation = ValidationState(3, 6, 4, 0.5, {"validation_loss": 0.5}, 1)
    run = RunState(validation=validation, best_weights=best)
    run.begin_attempt("launch", 2, None)
    checkpointer = Checkpointer(LocalCheckpointStore(tmp_path / "ckpt"), keep_last=2)
    try:
        for step in (5, 6, 7):  # three saves: keep-two has evicted the first, the best is in the others
            run.step = step
            meta = CheckpointMeta(step, 0, 0, "interval", 1, "launch", 2, "dv-1", config.trajectory())
            checkpointer.save(checkpoint_state(objects, run, config, "dv-1"), meta)
        checkpointer.wait_until_durable()
        loaded = checkpointer.newest_valid()
    finally:
        checkpointer.close()
    assert loaded is not None and loaded.record.step == 7

    restored = restore(objects, loaded, "dv-1")
    assert restored.validation == validation
    assert restored.best_weights is not None and restored.best_weights.keys() == best.keys()
    assert all(torch.equal(restored.best_weights[name], best[name]) for name in best)
    first = next(iter(best))
    assert not torch.equal(loaded.state["model"][first], best[first])  # apart from the weights trained on

    del loaded.state["validation"]  # a checkpoint from before validation existed: nothing validated yet
    fresh = restore(objects, loaded, "dv-1")
    assert (fresh.validation, fresh.best_weights) == (ValidationState(), None)


def test_a_validating_runs_checkpoint_size_estimate_counts_the_best_weights_once_more():
    model = torch.nn.Linear(10, 4)  # 44 float32 parameters in 2 tensors
    extra = estimate_checkpoint_bytes(model, best_copy=True) - estimate_checkpoint_bytes(model)
    assert extra == 44 * 4 + 2 * PER_TENSOR_OVERHEAD_BYTES
