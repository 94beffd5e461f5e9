"""`retrain demo`'s story at a smaller size: every stage's decision, from the landing files to the gate.

One run of the story (module fixture) is asserted stage by stage. Its first pipeline run is also where an
evicted train step is tested end to end: the local runner restarts it, it resumes from its checkpoint, and
its MLflow run stays one complete run. Its image chapter is the image task's end-to-end test: `retrain run
--model-name shapes` (models/shapes.toml) registers a champion that `mlflow.pyfunc` serves on uint8 images.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from components.local import RunStore
from demo import cli as demo_cli
from demo.narration import Narrator
from demo.scenario import DemoSize
from demo.story import DemoStory, fresh_home
from demo.summary import summarise
from training.gate.history import model_listing
from training.gate.registry import ModelRegistry, resolve_store
from training.local_state import default_mlflow_tracking_uri

# Smaller than `make demo`, on one process (DDP is tested in tests/training/engine/test_resume.py). The train
# step must outlast its first durable checkpoint, when the eviction notice is sent: that save is taken after
# step 1, but its writer runs at the lowest CPU priority, so on a busy machine it lands many steps later.
SMALL = DemoSize(epochs=20, processes=1)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoStory, str]:
    out = io.StringIO()
    story = DemoStory(fresh_home(tmp_path_factory.mktemp("demo")), SMALL, Narrator(out, time.monotonic))
    try:
        story.run()
        listing = model_listing(ModelRegistry(resolve_store(None, {}, story.home)), "digits")
        summarise(story.say, story.record, story.front_door.ledger_snapshot(), listing)
    finally:
        print(out.getvalue())  # shown by pytest when a test fails
    return story, out.getvalue()


def decisions(story: DemoStory) -> list[tuple[str, str]]:
    return [(label, outcome.decision) for label, outcome in story.record.deliveries]


def test_landing_files_are_debounced_into_one_batch_and_a_redelivery_is_a_duplicate(story):
    assert decisions(story[0])[:4] == [
        ("batch-0001.csv", "debounced"),
        ("batch-0002.csv", "debounced"),
        ("batch-0003.csv", "debounced"),
        ("batch-0001.csv", "duplicate"),
    ]


def test_one_run_covers_the_batch_survives_its_eviction_and_registers_the_first_champion(story):
    record = story[0].record
    first = record.submissions[0]
    assert (first.kind, first.status, len(first.inputs)) == ("blob", "Completed", 3)
    assert record.train_attempts[0] == [75, 0]
    assert record.eviction_checkpoint is not None
    assert record.registrations[0]["registered_version"] == "1"
    assert record.registrations[0]["decision"]["accepted"] is True


def test_the_evicted_train_step_resumed_from_its_checkpoint_and_lost_nothing(story):
    home = story[0].home
    run = RunStore(home / "runs").load(story[0].record.submissions[0].details["run_id"])
    train = run.step("train")
    log = Path(train.log).read_text()
    assert "SIGTERM received: saving after the current step" in log and "resumed from checkpoint" in log
    assert "RuntimeWarning" not in log  # torchrun is called, not re-run as __main__ over its warm import
    metadata = json.loads((Path(train.outputs["model"]) / "metadata.json").read_text())
    assert metadata["evictions_survived"] == 1 and metadata["world_size"] == SMALL.processes
    assert [attempt["ended"] for attempt in metadata["attempts"]] == ["preempted", "completed"]
    assert not (home / "runs" / run.run_id / "train" / "pid").exists()

    # One MLflow run across both attempts, with every step's loss and the preemption on it.
    client = MlflowClient(default_mlflow_tracking_uri(home))
    mlflow_run = client.get_run(metadata["mlflow_run_id"])
    assert mlflow_run.info.status == "FINISHED"
    loss_steps = sorted({metric.step for metric in client.get_metric_history(mlflow_run.info.run_id, "loss")})
    assert loss_steps == list(range(1, metadata["steps"] + 1))
    assert int(mlflow_run.data.tags["retrain.preempted_at_step"]) >= 1
    assert mlflow_run.data.tags["retrain.data_version"] == metadata["data_version"]
    assert mlflow_run.data.params["global_batch_size"] == str(SMALL.global_batch_size)
    assert 0.5 < mlflow_run.data.metrics["validation_accuracy"] <= 1.0
    assert client.get_metric_history(mlflow_run.info.run_id, "checkpoint_blocked_ms")


def test_the_shifted_batch_raises_a_drift_alert_that_the_front_door_accepts(story):
    record = story[0].record
    assert decisions(story[0])[4:] == [("batch-0004.csv", "debounced"), ("drift alert", "accepted")]
    assert record.drift["alert"] is True
    assert (
        record.drift["drifted_count"] >= 1
        and record.drift["max_psi"] > record.drift["policy"]["psi_threshold"]
    )


def test_the_alert_retrains_on_all_the_data_and_the_gate_promotes_the_better_model(story):
    record = story[0].record
    second = record.submissions[1]
    assert (second.kind, second.status, len(second.inputs)) == ("drift", "Completed", 1)
    assert record.train_attempts[1] == [0]
    decision = record.registrations[1]["decision"]
    assert decision["accepted"] is True and decision["champion_version"] == "1"
    listing = model_listing(ModelRegistry(resolve_store(None, {}, story[0].home)), "digits")
    assert listing["aliases"] == {"champion": "2", "previous": "1"}
    newest = listing["versions"][0]["lineage"]
    assert (newest["trigger"]["kind"], newest["raw_version"]) == ("drift", second.raw_version)


def test_an_image_model_goes_through_the_same_engine_and_serves_uint8_images(story):
    record = story[0].record
    chapter = record.image
    registration = chapter.registration
    assert registration["model_name"] == "shapes" and registration["task"]["ref"] == "image"
    assert (registration["decision"]["accepted"], registration["registered_version"]) == (True, "1")
    listing = model_listing(ModelRegistry(resolve_store(None, {}, story[0].home)), "shapes")
    assert listing["aliases"] == {"champion": "1"}
    # The champion, served through mlflow.pyfunc, answers class folder names for new uint8 images.
    assert len(chapter.answers) == 8
    assert {answer for _, answer in chapter.answers} <= {"circle", "cross", "square", "triangle"}
    assert chapter.right >= 4
    assert f"served {chapter.right} of 8 new images right" in story[1]


def test_each_model_s_runs_are_in_an_experiment_named_as_the_model(story):
    home, record = story[0].home, story[0].record
    client = MlflowClient(default_mlflow_tracking_uri(home))
    experiments = {experiment.name: experiment.experiment_id for experiment in client.search_experiments()}
    assert "retrain" not in experiments  # the one experiment every model once shared
    for name, versions in (("digits", ("1", "2")), ("shapes", ("1",))):
        in_its_own = {run.info.run_id for run in client.search_runs([experiments[name]])}
        # Each version was registered from its training run, which is in its model's experiment.
        assert {client.get_model_version(name, version).run_id for version in versions} <= in_its_own
    run = RunStore(home / "runs").load(record.submissions[0].details["run_id"])
    for step in ("train", "register"):
        command = run.step(step).command
        assert command[command.index("--mlflow-experiment") + 1] == "digits"


def test_the_summary_shows_every_stage_the_estimates_and_the_plots(story):
    _, output = story
    for heading in (
        "Events -> decisions", "Submissions -> pipeline runs -> model versions", "with lineage",
        "The planner's spot estimate", "Where everything is",
    ):  # fmt: skip
        assert heading in output
    assert output.count("spot pays") >= 2
    plots = [Path(line.split()[-1]) for line in output.splitlines() if line.strip().startswith("plot ")]
    assert len(plots) == 3
    assert all(plot.read_bytes().startswith(PNG_SIGNATURE) for plot in plots)


def test_the_demo_command_refuses_too_few_epochs_in_one_line(tmp_path):
    args = argparse.Namespace(state_root=tmp_path, epochs=1)
    with pytest.raises(Exception, match=r"^epochs >= 2 and processes >= 1") as raised:
        demo_cli.run_demo(args, io.StringIO())
    assert "\n" not in str(raised.value)
