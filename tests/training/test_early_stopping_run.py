"""Validation while training, end to end: a run that overfits stops early, writes its best validated step's
weights, and ends the same when SIGKILLed twice and resumed (real torchrun, gloo, 2 processes, on CPU), and
when its last attempt runs on one process.

The one end-to-end test of the feature; its rules are tested as functions in test_early_stopping.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers.training.overfitting import STEPS_PER_EPOCH, TOTAL_STEPS
from helpers.training.run_outputs import newest_record, read_metadata
from helpers.training.training_process import is_step, kill_process_tree, resumed_event
from mlflow.tracking import MlflowClient

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.local_store import LocalCheckpointStore
from training.engine.outputs import load_model_file, weights_sha256

OUTCOME_KEYS = (
    "weights_sha256",
    "stop_reason",
    "stopped_at_step",
    "candidate",
    "candidate_step",
    "validation",
)


def _newest_state(checkpoints: Path) -> dict:
    loaded = Checkpointer(LocalCheckpointStore(checkpoints), keep_last=2).newest_valid()
    assert loaded is not None
    return loaded.state


def test_an_overfitting_run_stops_early_keeps_its_best_step_and_resumes_to_the_same_end(
    start_overfitting, tmp_path
):
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    reference = start_overfitting("uninterrupted", tracking=["--mlflow-tracking-uri", tracking_uri])
    assert reference.finish() == 0, (tmp_path / "uninterrupted" / "attempt-1.log").read_text()[-3000:]
    expected = read_metadata(tmp_path / "uninterrupted" / "out")
    validations = [event for event in reference.events_seen if event["event"] == "validation"]
    losses = {event["step"]: event["metrics"]["validation_loss"] for event in validations}
    best, stopped = expected["candidate_step"], expected["stopped_at_step"]

    # It stopped early, by the rule: validated once an epoch, and stopped at the second validation in a row
    # (the patience) that did not beat the lowest validation loss.
    assert expected["stop_reason"] == "early_stopping" and expected["steps"] == stopped < TOTAL_STEPS
    assert list(losses) == list(range(STEPS_PER_EPOCH, stopped + 1, STEPS_PER_EPOCH))
    assert best == min(losses, key=losses.__getitem__) and stopped == best + 2 * STEPS_PER_EPOCH
    assert [event["stop"] for event in validations] == [False] * (len(validations) - 1) + [True]

    # Each validation is in MLflow at its step, and the run's tags say how it ended.
    client = MlflowClient(tracking_uri)
    run = client.get_run(expected["mlflow_run_id"])
    history = client.get_metric_history(run.info.run_id, "validation_loss")
    logged = {metric.step: metric.value for metric in history}
    assert logged == losses and len(history) == len(losses)  # once a validation: not again at the end
    # The candidate's own score, under its own name: the best step's, not the last validation's.
    assert run.data.metrics["candidate_validation_loss"] == losses[best] != history[-1].value
    assert (run.data.tags["retrain.stop_reason"], run.data.tags["retrain.best_step"]) == (
        "early_stopping",
        str(best),
    )

    # Its model is the best validation step's, and metadata.json says so.
    assert expected["candidate"] == "best" and expected["validation"]["best_step"] == best
    assert expected["validation"]["best_metrics"]["validation_loss"] == losses[best]
    assert expected["final_metrics"]["validation_loss"] == losses[best]  # the written model, scored again
    _, model, _ = load_model_file(tmp_path / "uninterrupted" / "out")
    assert weights_sha256(model) == expected["weights_sha256"]
    final_state = _newest_state(tmp_path / "uninterrupted" / "checkpoints")
    model.load_state_dict(final_state["model"])  # the last step's weights, which the final checkpoint holds
    assert weights_sha256(model) != expected["weights_sha256"]

    # The same run, SIGKILLed twice: once after its first validation, once after its best step, whose
    # weights only a checkpoint can then bring back (the training has moved past them).
    checkpoints = tmp_path / "killed" / "checkpoints"
    first = start_overfitting("killed")
    seen = first.wait_for(lambda event: event["event"] == "checkpoint" and event["step"] > STEPS_PER_EPOCH)
    first.wait_for(is_step(seen["step"] + 3))
    kill_process_tree(first)
    first_kill = newest_record(str(checkpoints)).step
    second = start_overfitting("killed")
    second.wait_for(lambda event: event["event"] == "checkpoint" and event["step"] > best)
    kill_process_tree(second)
    second_kill = newest_record(str(checkpoints)).step
    assert STEPS_PER_EPOCH < first_kill < best < second_kill < stopped
    assert not (tmp_path / "killed" / "out" / "metadata.json").exists()
    # A copy of the run so far finishes on one process: the best weights it writes are the checkpoint's.
    shutil.copytree(checkpoints, tmp_path / "one-process" / "checkpoints")
    alone = start_overfitting("one-process", nproc=1)
    assert alone.finish() == 0, (tmp_path / "one-process" / "attempt-4.log").read_text()[-3000:]
    last = start_overfitting("killed")
    assert last.finish() == 0, (tmp_path / "killed" / "attempt-5.log").read_text()[-3000:]

    assert [resumed_event(process)["step"] for process in (second, last)] == [first_kill, second_kill]
    metadata = read_metadata(tmp_path / "killed" / "out")
    assert {key: metadata[key] for key in OUTCOME_KEYS} == {key: expected[key] for key in OUTCOME_KEYS}
    endings = [attempt["ended"] for attempt in metadata["attempts"]]
    assert endings == ["interrupted", "interrupted", "completed"]
    alone_metadata = read_metadata(tmp_path / "one-process" / "out")
    assert [attempt["world_size"] for attempt in alone_metadata["attempts"]] == [2, 2, 1]
    assert {key: alone_metadata[key] for key in OUTCOME_KEYS} == {key: expected[key] for key in OUTCOME_KEYS}
