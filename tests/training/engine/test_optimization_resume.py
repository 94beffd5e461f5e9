"""The step options end to end, on 2 processes with torchrun and gloo: a task's own optimiser, and
gradient accumulation, each trained and killed (SIGKILL) and resumed to the uninterrupted weights."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers.training import sgd_task
from helpers.training.run_outputs import read_metadata
from helpers.training.sgd_task import step_schedule
from helpers.training.small_run import STEPS_PER_EPOCH
from helpers.training.training_process import kill_mid_interval, resumed_event, train_to_end

from training.engine.outputs import read_model_payload

ONE_EPOCH = ["--epochs", "1"]  # 44 steps: checkpoints at 10, 20, 30 and 40 leave room for a kill
SGD_TASK = [*ONE_EPOCH, "--task", f"{Path(sgd_task.__file__)}:SgdTabular"]
NO_DROPOUT = [*ONE_EPOCH, "--task-option", "dropout=0"]  # so that the only randomness is the data order
ACCUMULATE_4 = [*NO_DROPOUT, "--accumulate-grad-batches", "4"]
# Four micro-batches sum the same gradient in another order: float32 rounding, nothing more. Measured: at
# most 6e-8 apart after 88 AdamW steps, the training loss's 7 significant digits alike.
WEIGHT_TOLERANCE = 1e-5


def test_a_task_s_sgd_on_a_step_schedule_trains_with_it_and_resumes_after_sigkill_exactly(
    prepared_data, start_training, folders, tmp_path, warm_starts
):
    uninterrupted = train_to_end(warm_starts, prepared_data, tmp_path / "uninterrupted", SGD_TASK)
    reference = read_metadata(tmp_path / "uninterrupted" / "out")

    durable = kill_mid_interval(start_training(extra=SGD_TASK), folders.checkpoints)
    final = start_training(extra=SGD_TASK)
    assert final.finish() == 0
    assert resumed_event(final)["step"] == durable and durable % STEPS_PER_EPOCH

    metadata = read_metadata(folders.out)
    assert metadata["weights_sha256"] == reference["weights_sha256"]
    assert metadata["steps"] == STEPS_PER_EPOCH and metadata["resumes"] == 1
    assert {
        key: metadata["optimization"][key] for key in ("optimizer", "lr_scheduler", "optimization_source")
    } == {
        "optimizer": "SGD",
        "lr_scheduler": "StepLR",
        "optimization_source": "task",
    }
    # The rate every step reported is the step schedule's, before the kill and after the resume alike (the
    # default, AdamW's warm-up, would start at --learning-rate / 20).
    for process in (uninterrupted, final):
        rates = {
            event["step"]: event["learning_rate"] for event in process.events_seen if event["event"] == "step"
        }
        assert rates and all(rate == step_schedule(step) for step, rate in rates.items())


def test_accumulating_4_micro_batches_on_2_processes_matches_the_whole_global_batch_and_resumes_exactly(
    prepared_data, start_training, folders, tmp_path, warm_starts
):
    train_to_end(warm_starts, prepared_data, tmp_path / "whole", NO_DROPOUT)
    train_to_end(warm_starts, prepared_data, tmp_path / "accumulated", ACCUMULATE_4)
    whole = read_model_payload(tmp_path / "whole" / "out")["state_dict"]
    accumulated = read_model_payload(tmp_path / "accumulated" / "out")["state_dict"]
    for name, weights in whole.items():
        torch.testing.assert_close(accumulated[name], weights, rtol=0, atol=WEIGHT_TOLERANCE)
    losses = [
        read_metadata(tmp_path / run / "out")["final_metrics"]["train_loss"]
        for run in ("whole", "accumulated")
    ]
    assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[0])
    reference = read_metadata(tmp_path / "accumulated" / "out")
    assert reference["optimization"]["accumulate_grad_batches"] == 4

    durable = kill_mid_interval(start_training(extra=ACCUMULATE_4), folders.checkpoints)
    final = start_training(extra=ACCUMULATE_4)
    assert final.finish() == 0
    assert resumed_event(final)["step"] == durable
    metadata = read_metadata(folders.out)
    assert metadata["weights_sha256"] == reference["weights_sha256"]
    assert metadata["steps"] == STEPS_PER_EPOCH and metadata["resumes"] == 1
