"""Eviction and resume, end to end: real torchrun, gloo, 2 processes, on CPU."""

from __future__ import annotations

import signal

from helpers.training.run_outputs import newest_record, read_metadata
from helpers.training.small_run import STEPS_PER_EPOCH, TOTAL_STEPS
from helpers.training.training_process import is_step, kill_twice_then_finish, resumed_event

from training.engine.preemption import PREEMPTED_EXIT_CODE


def test_sigkill_twice_then_restart_ends_with_the_uninterrupted_weights(
    uninterrupted_run, start_training, folders
):
    def start():
        assert not (folders.out / "metadata.json").exists()  # nothing written by a killed attempt
        return start_training()

    durable_at_kill, resumes = kill_twice_then_finish(start, folders.checkpoints)

    # Both restarts continued mid-epoch from the newest durable checkpoint, with no batch replayed or skipped.
    assert all(step % STEPS_PER_EPOCH for step in durable_at_kill)
    assert [(event["step"], event["epoch"], event["position"]) for event in resumes] == [
        (step, step // STEPS_PER_EPOCH, (step % STEPS_PER_EPOCH) * 32) for step in durable_at_kill
    ]
    metadata = read_metadata(folders.out)
    assert metadata["weights_sha256"] == uninterrupted_run["weights_sha256"]
    assert metadata["steps"] == TOTAL_STEPS
    assert metadata["resumes"] == 2 and metadata["evictions_survived"] == 2
    endings = [attempt["ended"] for attempt in metadata["attempts"]]
    assert endings == ["interrupted", "interrupted", "completed"]


def test_sigterm_saves_the_agreed_step_at_once_and_the_restart_loses_nothing(
    uninterrupted_run, start_training, folders
):
    process = start_training()
    observed = process.wait_for(is_step(30))["step"]
    process.send_signal(signal.SIGTERM)
    saved = process.wait_for(lambda event: event["event"] == "checkpoint" and event["reason"] == "preempted")
    assert process.finish() == PREEMPTED_EXIT_CODE

    # "At once" as the trainer guarantees it, in steps rather than seconds: nothing trained past the step
    # the ranks agreed on, one after the notice was seen.
    record = newest_record(folders.checkpoints)
    assert (record.name, record.reason, record.step) == (saved["name"], "preempted", saved["step"])
    last_trained = max(event["step"] for event in process.events_seen if event["event"] == "step")
    assert observed <= saved["step"] and last_trained - saved["step"] <= 1

    restart = start_training()
    assert restart.finish() == 0
    assert resumed_event(restart)["step"] == saved["step"]
    metadata = read_metadata(folders.out)
    assert metadata["weights_sha256"] == uninterrupted_run["weights_sha256"]
    assert [attempt["ended"] for attempt in metadata["attempts"]] == ["preempted", "completed"]
    assert metadata["evictions_survived"] == 1


def test_resume_on_fewer_processes_continues_at_the_same_global_sample(start_training, folders):
    process = start_training(nproc=2)
    process.wait_for(is_step(50))
    process.send_signal(signal.SIGTERM)
    assert process.finish() == PREEMPTED_EXIT_CODE
    saved = newest_record(folders.checkpoints)

    restart = start_training(nproc=1)
    assert restart.finish() == 0
    resumed = resumed_event(restart)
    assert (resumed["step"], resumed["epoch"], resumed["position"]) == (
        saved.step,
        saved.epoch,
        saved.position,
    )
    first_step = next(event for event in restart.events_seen if event["event"] == "step")
    expected_position = saved.position + 32
    if expected_position + 32 > 1421:
        expected_position = 0
    assert first_step["step"] == saved.step + 1 and first_step["position"] == expected_position
    metadata = read_metadata(folders.out)
    assert metadata["steps"] == TOTAL_STEPS and metadata["world_size"] == 1
    assert [attempt["world_size"] for attempt in metadata["attempts"]] == [2, 1]
