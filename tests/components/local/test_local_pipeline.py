"""`retrain run` and `retrain runs` on the real pipeline: prep -> train -> evaluate -> register.

Every step runs its component's real command (training.cli / training.engine.worker under torchrun)
with a small training. The runs share one state folder, as a developer's runs do; each test states what
it expects of the cache given what the module's first run left there.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers.components.run_requests import SMALL_MODEL, SMALL_TRAINING, pinned_request

import retrain_cli
from components.local import LocalRunner, LocalStepFailed, RunnerOptions, RunRecord, RunStore
from components.local import cli as local_cli
from components.local.cache import STAGING_PREFIX
from components.local.submitter import LocalSubmitter
from components.model_config import MODELS_DIR_VARIABLE
from components.request import CANCELED, COMPLETED, FAILED
from components.specs import REPO_ROOT
from training.tasks.tabular.sample_data import write_sample_batches


def small_training(epochs: int = SMALL_TRAINING["epochs"]) -> list[str]:
    """`retrain run` options for the small training of a small model, of the tabular task: no configuration
    file applies (see `retrain` below)."""
    options = ["--task", "tabular", "--epochs", str(epochs)]
    for name, value in SMALL_TRAINING.items():
        if name != "epochs":
            options += ["--param", f"{name}={value}"]
    for name, value in SMALL_MODEL.items():
        options += ["--task-option", f"{name}={value}"]
    return options


def retrain(state: Path, *argv: str) -> tuple[int, str]:
    """Run a `retrain run|runs` command as the root CLI does, and return its exit code and output. No
    model configuration file applies (the repository's models/digits.toml is tested on its own): the runs
    train the defaults, as the direct runner requests below do."""
    parser = argparse.ArgumentParser(prog="retrain")
    local_cli.register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.state_root = state
    args.environ = {**os.environ, MODELS_DIR_VARIABLE: str(state.parent / "no-model-configs")}
    out = io.StringIO()
    try:
        return args.handler(args, out), out.getvalue()
    finally:
        print(out.getvalue())  # shown by pytest when a test fails


def newest_run(state: Path) -> RunRecord:
    return RunStore(state / "runs").list(limit=1)[0]


def reused(record: RunRecord) -> dict[str, bool]:
    return {step.name: step.reused for step in record.steps}


def cache_entries(state: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(state)): path.read_bytes()
        for path in sorted((state / "cache").rglob("*"))
        if path.is_file() and STAGING_PREFIX not in str(path)
    }


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pipeline") / "state"


@pytest.fixture(scope="module")
def first_run(state: Path, sample_raw: Path) -> tuple[RunRecord, str]:
    code, output = retrain(state, "run", "--data", str(sample_raw), *small_training())
    assert code == 0, output
    return newest_run(state), output


def test_the_first_run_executes_every_components_real_command(first_run, state):
    record, output = first_run
    assert record.status == COMPLETED
    assert reused(record) == {"prep": False, "train": False, "evaluate": False, "register": False}
    commands = {step.name: step.command for step in record.steps}
    assert commands["prep"][:4] == (sys.executable, "-m", "training.cli", "prepare")
    assert commands["train"][:5] == (
        sys.executable, "-m", "training.engine.torchrun_agent", "--standalone", "--nproc-per-node=1"
    )  # fmt: skip
    assert commands["train"][6:8] == ("-m", "training.engine.worker")
    assert commands["evaluate"][:4] == (sys.executable, "-m", "training.cli", "evaluate")
    assert commands["register"][:4] == (sys.executable, "-m", "training.cli", "register")

    model = Path(record.step("train").outputs["model"])
    metadata = json.loads((model / "metadata.json").read_text())
    assert (metadata["config"]["epochs"], metadata["config"]["task_options"]["hidden_width"]) == (2, 64)
    assert (Path(record.step("evaluate").outputs["evaluation"]) / "evaluation.json").is_file()
    registration = Path(record.outputs["registration"])
    decision = json.loads((registration / "registration.json").read_text())
    assert (decision["decision"]["accepted"], decision["registered_version"]) == (
        True,
        "1",
    )  # the first model
    # The gate's decision beside the run's status, as the local submitter reports it to the front door too,
    # then what it weighed: the candidate's metrics (beside no champion's), the primary one first.
    lines = output.splitlines()
    said = lines.index(
        f"run {record.run_id}: Completed, registered as v1: no champion yet; first-model floors met"
    )
    assert lines[said - 1] == (
        f"train: ran all {metadata['steps']} steps; candidate: the {metadata['candidate']} step's weights, "
        f"step {metadata['candidate_step']}"
    )  # how training ended, before the gate's decision
    header, primary, *others = lines[said + 1 : -1]
    assert header.split() == ["metric", "candidate", "no", "champion"]
    assert primary.split() == ["macro_f1", f"{decision['metrics']['macro_f1']:.4f}", "-", "(primary)"]
    assert [line.split()[0] for line in others] == [
        name for name in decision["metrics"] if name != "macro_f1"
    ]
    assert lines[-1] == f"registration: {registration}"
    details = LocalSubmitter(RunnerOptions(state_root=state), os.environ).status(record.job_name).details
    assert (details["registered_version"], details["decision"]) == ("1", "registered")
    assert details["reasons"] == decision["decision"]["reasons"]
    assert output.startswith("on Azure ML, estimated cost")  # printed before the run starts
    assert [line.split()[:2] for line in output.splitlines()[1:9:2]] == [
        ["prep", "started"], ["train", "started"], ["evaluate", "started"], ["register", "started"]
    ]  # fmt: skip


def test_a_second_run_on_the_same_data_reuses_every_step(state, sample_raw, first_run):
    code, output = retrain(state, "run", "--data", str(sample_raw), *small_training())

    record = newest_run(state)
    assert code == 0
    assert reused(record) == {"prep": True, "train": True, "evaluate": True, "register": True}
    assert record.outputs == first_run[0].outputs
    assert output.count(" reused (cache entry ") == 4


def test_a_forced_run_trains_from_scratch_in_a_checkpoint_folder_of_its_own(state, sample_raw, first_run):
    first_checkpoints = Path(first_run[0].step("train").outputs["checkpoints"])
    kept = sorted(path.name for path in first_checkpoints.iterdir())

    code, output = retrain(state, "run", "--data", str(sample_raw), *small_training(), "--force-rerun")

    record = newest_run(state)
    assert code == 0, output
    assert record.forced and reused(record) == {
        "prep": False,
        "train": False,
        "evaluate": False,
        "register": False,
    }
    checkpoints = Path(record.step("train").outputs["checkpoints"])
    assert checkpoints == first_checkpoints.with_name(f"{first_checkpoints.name}-forced-{record.run_id}")
    metadata = json.loads((Path(record.step("train").outputs["model"]) / "metadata.json").read_text())
    assert [attempt["resumed_from"] for attempt in metadata["attempts"]] == [None]  # from scratch
    assert sorted(path.name for path in first_checkpoints.iterdir()) == kept  # the key's own, untouched


def test_changing_the_code_reruns_every_step_and_an_identical_copy_reuses_them(
    state, sample_raw, first_run, tmp_path
):
    code_root = tmp_path / "code"
    for package in ("training", "core"):  # the steps' code snapshot (.amlignore)
        shutil.copytree(REPO_ROOT / package, code_root / package)
    shutil.copy(REPO_ROOT / ".amlignore", code_root / ".amlignore")
    runner = LocalRunner(RunnerOptions(state_root=state, code_root=code_root), os.environ, io.StringIO())
    request = pinned_request(state, sample_raw, parameters=SMALL_TRAINING, task_options=SMALL_MODEL)

    identical = runner.run(request)
    assert reused(identical) == {"prep": True, "train": True, "evaluate": True, "register": True}

    # The edit also notes each process that imports the edited module: the steps must run the code as it is
    # now, not as a warm starter kept from the last run imported it (it would have no note to write).
    imported = tmp_path / "imported-edited-cli"
    with (code_root / "training" / "cli.py").open("a") as source:
        source.write(f"\nwith open({str(imported)!r}, 'a') as _noted:\n    _noted.write('imported\\n')\n")
    edited = runner.run(request)
    assert reused(edited) == {"prep": False, "train": False, "evaluate": False, "register": False}
    assert edited.status == COMPLETED
    assert all(step.command and step.log for step in edited.steps)
    assert imported.exists()


def test_new_data_reruns_every_step_and_a_degraded_data_set_is_refused_by_the_gate(
    state, first_run, tmp_path, monkeypatch, capsys
):
    # The same digits with half the labels wrong, as a broken upstream labeller delivers them.
    degraded = tmp_path / "degraded"
    write_sample_batches(degraded, batches=4, label_noise=0.5)

    code, output = retrain(state, "run", "--data", str(degraded), *small_training())

    record = newest_run(state)
    assert code == 0  # a refused candidate is the pipeline working, not failing
    assert record.data_version != first_run[0].data_version
    assert reused(record) == {"prep": False, "train": False, "evaluate": False, "register": False}
    assert "resumed from checkpoint" not in Path(record.step("train").log).read_text()
    outcome = json.loads((Path(record.outputs["registration"]) / "registration.json").read_text())
    assert (outcome["decision"]["accepted"], outcome["registered_version"]) == (False, None)
    reasons = " ".join(outcome["decision"]["reasons"])
    assert "accuracy" in reasons and "below the floor" in reasons and "champion v" in reasons, reasons
    refused = f"run {record.run_id}: Completed, refused: {'; '.join(outcome['decision']['reasons'])}"
    lines = output.splitlines()
    table = lines[lines.index(refused) + 1 : lines.index(refused) + 3]
    champion = outcome["champion_compared"]  # the candidate's scores beside the champion's it lost to
    assert table[0].split() == ["metric", "candidate", "champion", f"v{champion['version']}"]
    scores = [f"{outcome['metrics']['macro_f1']:.4f}", f"{champion['metrics']['macro_f1']:.4f}"]
    assert table[1].split() == ["macro_f1", *scores, "(primary)"]
    details = LocalSubmitter(RunnerOptions(state_root=state), os.environ).status(record.job_name).details
    assert (details["registered_version"], details["decision"]) == (None, "refused")

    monkeypatch.setenv("RETRAIN_HOME", str(state))
    capsys.readouterr()  # only what `models` prints, below
    assert retrain_cli.main(["models", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert all(version["lineage"]["raw_version"] != record.data_version for version in listing["versions"])


def test_a_failing_step_fails_the_run_with_its_log_tail_and_leaves_the_cache_intact(
    state, sample_raw, first_run, tmp_path, capsys
):
    # Its only file does not fit: a bad file among good ones would be left out, and the rest trained.
    bad = tmp_path / "bad"
    bad.mkdir()
    header, *rows = (sample_raw / "batch-0001.csv").read_text().splitlines(keepends=True)
    (bad / "batch-0005.csv").write_text(header.replace("label", "lable", 1) + "".join(rows[:3]))
    entries_before = cache_entries(state)

    with pytest.raises(LocalStepFailed) as failed:
        retrain(state, "run", "--data", str(bad), *small_training())

    headline, *tail = str(failed.value).splitlines()
    assert headline.startswith("step 'prep' failed with exit code 2; its log: ")
    assert any("retrain: error:" in line and "batch-0005.csv" in line for line in tail)
    # The run's line says where and why, in the step's own words (the output, printed by `retrain` above).
    [said] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("run ")]
    assert said.startswith(f"run {failed.value.run_id}: Failed at prep: ") and "batch-0005.csv" in said
    assert "retrain: error:" not in said
    record = newest_run(state)
    assert (record.run_id, record.status, record.failed_step) == (failed.value.run_id, FAILED, "prep")
    assert {step.name: step.status for step in record.steps} == {
        "prep": FAILED, "train": CANCELED, "evaluate": CANCELED, "register": CANCELED
    }  # fmt: skip
    assert [path.name for path in (state / "runs" / record.run_id).iterdir() if path.is_dir()] == ["prep"]
    assert cache_entries(state) == entries_before

    code, _ = retrain(state, "run", "--data", str(sample_raw), *small_training())
    assert code == 0
    assert reused(newest_run(state)) == {"prep": True, "train": True, "evaluate": True, "register": True}


def test_runs_lists_the_runs_newest_first_with_each_steps_status_and_reuse(state, first_run):
    code, listed = retrain(state, "runs", "--json", "--limit", "2")
    records = json.loads(listed)
    assert code == 0
    assert len(records) == 2
    assert records[0]["created_at"] >= records[1]["created_at"]
    assert records[0]["run_id"] == newest_run(state).run_id

    code, text = retrain(state, "runs", "--limit", "50")
    first = first_run[0]
    assert f"{first.run_id}  Completed  {first.run_key}" in text
    assert "  prep      Completed ran " in text and "  prep      Completed reused " in text
    assert f"model={first.step('train').outputs['model']}" in text


def test_a_train_step_evicted_after_its_first_checkpoint_resumes_and_the_run_says_at_which_step_and_why(
    state, sample_raw, first_run
):
    from demo.eviction import EvictOnFirstCheckpoint

    # Other epochs than the module's other runs: a training of its own (its own checkpoint folder).
    evictor = EvictOnFirstCheckpoint(state / "checkpoints")
    progress = io.StringIO()
    runner = LocalRunner(RunnerOptions(state_root=state), os.environ, progress, on_process_started=evictor)
    parameters = {**SMALL_TRAINING, "epochs": 4}
    record = runner.run(pinned_request(state, sample_raw, parameters=parameters, task_options=SMALL_MODEL))

    assert evictor.wait() is not None, evictor.error
    assert record.status == COMPLETED and len(record.step("train").attempts) == 2
    model = Path(record.step("train").outputs["model"])
    evicted, resumed = json.loads((model / "metadata.json").read_text())["attempts"]
    assert (
        evicted["ended"] == "preempted"
        and resumed["started_at_step"] >= SMALL_TRAINING["checkpoint_every_steps"]
    )
    said = [line for line in progress.getvalue().splitlines() if line.startswith("train ")]
    assert said[-1] == (
        f"train     resumed at step {resumed['started_at_step']} after an eviction "
        f"(checkpoint {resumed['resumed_from']})"
    )
    assert said[-2].startswith("train     completed in ")  # said once the step has ended
    assert said[1].startswith("train     preempted (exit 75) after ")


def test_an_fsdp_run_trains_sharded_on_two_processes_and_its_champion_serves_through_pyfunc(
    state, sample_raw, first_run, monkeypatch
):
    # The module's data and small training, under another model name (its own first champion), with the
    # train step's strategy set as a user sets it: `--param strategy=fsdp`, on 2 processes so that FSDP
    # shards (with 1 it would train the model unsharded).
    argv = ["--model-name", "digits-fsdp", *small_training(), "--param", "strategy=fsdp", "--nproc", "2"]
    code, output = retrain(state, "run", "--data", str(sample_raw), *argv)
    assert code == 0, output
    record = newest_run(state)
    assert record.status == COMPLETED
    # The same data and task as the first run's: its prepared data is reused; the training is another.
    assert reused(record) == {"prep": True, "train": False, "evaluate": False, "register": False}
    command = record.step("train").command
    assert "--nproc-per-node=2" in command
    assert command[command.index("--strategy") + 1] == "fsdp"
    assert command[command.index("--checkpoint-layout") + 1] == "auto"

    metadata = json.loads((Path(record.step("train").outputs["model"]) / "metadata.json").read_text())
    assert (metadata["strategy"], metadata["world_size"]) == ("fsdp", 2)
    assert metadata["checkpoints"]["layout"] == "sharded"  # auto, under fsdp: every rank writes its shard
    shards = Path(metadata["checkpoints"]["location"]).glob("*.shard-*")
    assert {path.name.rsplit(".shard-", 1)[1] for path in shards} == {"00000", "00001"}
    registration = json.loads((Path(record.outputs["registration"]) / "registration.json").read_text())
    assert (registration["decision"]["accepted"], registration["registered_version"]) == (True, "1")

    # model.pt is the gathered, unsharded state dict: the champion loads and answers as any other.
    import mlflow.pyfunc
    import pandas as pd

    from training.local_state import default_mlflow_tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", default_mlflow_tracking_uri(state))
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading prepends the model's code; undone after
    served = mlflow.pyfunc.load_model("models:/digits-fsdp@champion")
    table = pd.read_csv(sample_raw / "batch-0001.csv")  # raw rows: the key and the label too
    answers = served.predict(table)
    assert len(answers) == len(table)
    assert (answers == table["label"].to_numpy()).mean() > 0.8  # real answers: digits is easy
