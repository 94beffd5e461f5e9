"""From a component's `command:` and a run request to the argument vector a step starts with."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from components.errors import SpecError, SubmissionError
from components.local.commands import render_command
from components.local.launch import TorchrunReports, exit_code_from, launch_argv, step_environment
from components.local.plan import durable_outputs, pipeline_values, step_argv, step_input_values
from components.parameters import check_parameters
from components.request import DataRef, RunRequest
from components.specs import Distribution, load_pipeline_spec
from core.warm_start import warm_start_setting

PIPELINE = load_pipeline_spec()
DATA = DataRef("rd-0123456789abcdef", "/data/raw")
PYTHON = "/venv/bin/python"


def request(**fields) -> RunRequest:
    return RunRequest(model_name="digits", data=DATA, **fields)


def test_inputs_and_outputs_are_substituted_and_values_with_spaces_stay_one_argument():
    argv = render_command(
        "python -m tool --in ${{inputs.raw}} --n ${{inputs.n}} --out ${{outputs.out}}",
        {"raw": Path("/data/my raw"), "n": 3},
        {"out": Path("/out/x")},
        "prep",
    )
    assert argv == ["python", "-m", "tool", "--in", "/data/my raw", "--n", "3", "--out", "/out/x"]


def test_an_optional_part_is_kept_only_when_every_input_it_uses_is_set():
    command = "run $[[--a ${{inputs.a}}]] $[[--b ${{inputs.b}} --c ${{inputs.c}}]] --d ${{inputs.d}}"
    inputs = {"a": "1", "b": "2", "c": None, "d": "'quoted; not a shell'"}
    assert render_command(command, inputs, {}, "step") == ["run", "--a", "1", "--d", "'quoted; not a shell'"]


def test_the_real_train_command_drops_its_unset_optional_flags():
    train = PIPELINE.steps["train"]
    inputs = step_input_values(
        train, pipeline_values(PIPELINE, request()), {}, {("prep", "prepared_data"): "/p"}
    )
    argv = render_command(train.component.command, inputs, {"model": "/m", "checkpoints": "/c"}, "train")
    assert "--checkpoint-every-steps" not in argv and "--mlflow-tracking-uri" not in argv
    assert argv[argv.index("--epochs") + 1] == "5"  # pipeline.yml's default, over the component's
    assert not [word for word in argv if word.startswith(("--validate", "--early-stopping", "--candidate"))]


def test_validation_parameters_reach_the_train_command_as_its_flags():
    train = PIPELINE.steps["train"]
    stopping = {"validate_every_epochs": 1, "early_stopping_metric": "validation_loss", "candidate": "best"}
    run = request(parameters=stopping)
    inputs = step_input_values(
        train, pipeline_values(PIPELINE, run), run.parameters, {("prep", "prepared_data"): "/p"}
    )
    argv = render_command(train.component.command, inputs, {"model": "/m", "checkpoints": "/c"}, "train")
    for flag, value in (
        ("--validate-every-epochs", "1"),
        ("--early-stopping-metric", "validation_loss"),
        ("--candidate", "best"),
    ):
        assert argv[argv.index(flag) + 1] == value
    assert "--early-stopping-patience" not in argv  # unset: the trainer's default


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (
            "python x ${{inputs.nope}}",
            r"step 's': its command uses \$\{\{inputs.nope\}\}, which the component",
        ),
        ("python x ${{outputs.nope}}", r"uses \$\{\{outputs.nope\}\}"),
        (
            "python x ${{inputs.unset}}",
            r"input 'unset', which is unset, outside an optional \$\[\[...\]\] part",
        ),
        ("python x ${{parent.inputs.a}}", r"an expression the local runner cannot resolve"),
        ("python 'x ${{inputs.a}}", r"cannot be split into arguments"),
    ],
)
def test_a_command_the_runner_cannot_resolve_is_a_one_line_spec_error(command, message):
    with pytest.raises(SpecError, match=message) as raised:
        render_command(command, {"a": "1", "unset": None}, {}, "s")
    assert "\n" not in str(raised.value)


def test_parameters_override_pipeline_defaults_which_override_component_defaults():
    values = pipeline_values(PIPELINE, request(parameters={"epochs": 2, "checkpoint_every_steps": "9"}))
    train = step_input_values(
        PIPELINE.steps["train"], values, {"checkpoint_every_steps": "9"}, {("prep", "prepared_data"): "/p"}
    )
    assert train["epochs"] == 2  # request parameter over pipeline.yml's 5
    assert train["checkpoint_every_steps"] == "9"  # request parameter over the component's unset
    assert train["checkpoint_every_seconds"] == "auto"  # pipeline.yml's
    assert train["learning_rate"] == 0.003  # pipeline.yml's, which is the component's too
    assert train["mlflow_tracking_uri"] is None  # optional, unset


def test_the_request_sets_the_data_model_name_and_trigger():
    values = pipeline_values(PIPELINE, request(trigger={"event": "blob-created", "id": "e1"}))
    assert values["raw_data"] == "/data/raw"
    assert values["model_name"] == "digits"
    assert values["trigger"] == "event=blob-created,id=e1"
    assert pipeline_values(PIPELINE, request())["trigger"] == "manual"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"epochz": 3},
            r"parameters \['epochz'\]: not inputs of the pipeline; expected some of \[.*'epochs'",
        ),
        ({"raw_data": "/x"}, r"parameter raw_data: set by the run itself"),
        ({"model_name": "x"}, r"parameter model_name: set by the run itself"),
        ({"previous_prepared": "/x"}, r"parameter previous_prepared: set by the run itself"),
        ({"prepared_data": "/x"}, r"parameters \['prepared_data'\]: not inputs of the pipeline"),
    ],
)
def test_a_parameter_that_is_not_a_settable_input_is_refused(parameters, message):
    with pytest.raises(SubmissionError, match=message):
        check_parameters(PIPELINE, parameters)


def test_a_required_input_left_unset_is_a_one_line_error_naming_step_and_input():
    register = PIPELINE.steps["register"]
    unbound = replace(register, inputs={k: v for k, v in register.inputs.items() if k != "model_name"})
    upstream = {("train", "model"): "/m", ("evaluate", "evaluation"): "/e", ("prep", "prepared_data"): "/p"}
    with pytest.raises(
        SubmissionError, match=r"^step 'register': input 'model_name' is required but unset; pass"
    ):
        step_input_values(unbound, pipeline_values(PIPELINE, request()), {}, upstream)


def test_only_outputs_with_a_fixed_path_in_the_pipeline_are_durable():
    assert durable_outputs(PIPELINE.steps["train"]) == {"checkpoints"}
    assert durable_outputs(PIPELINE.steps["prep"]) == frozenset()


def test_python_is_this_interpreter_and_a_pytorch_step_runs_under_torchrun(tmp_path):
    assert launch_argv(["python", "-m", "x"], None, 1, PYTHON, "s") == [PYTHON, "-m", "x"]
    assert launch_argv(["tool", "--flag"], None, 1, PYTHON, "s") == ["tool", "--flag"]
    reports = TorchrunReports.in_folder(tmp_path)
    assert launch_argv(["python", "-m", "w", "--a"], Distribution("pytorch"), 4, PYTHON, "s", reports) == [
        PYTHON, "-m", "training.engine.torchrun_agent", "--standalone", "--nproc-per-node=4",
        f"--log-dir={tmp_path / 'torchrun'}", "-m", "w", "--a",
    ]  # fmt: skip
    with pytest.raises(SpecError, match=r"step 's': a distributed command must start with `python`"):
        launch_argv(["torchrun", "x"], Distribution("pytorch"), 2, PYTHON, "s")
    with pytest.raises(SpecError, match=r"distribution type 'mpi' cannot run locally; expected 'pytorch'"):
        launch_argv(["python", "x"], Distribution("mpi"), 2, PYTHON, "s")


def test_the_train_step_uses_the_requested_process_count():
    train = PIPELINE.steps["train"]
    inputs = step_input_values(
        train, pipeline_values(PIPELINE, request()), {}, {("prep", "prepared_data"): "/p"}
    )
    argv = step_argv(train, inputs, {"model": Path("/m"), "checkpoints": Path("/c")}, 3, sys.executable)
    assert argv[:5] == [
        sys.executable,
        "-m",
        "training.engine.torchrun_agent",
        "--standalone",
        "--nproc-per-node=3",
    ]


def test_a_step_gets_the_callers_environment_the_state_folder_and_for_torchrun_one_thread(tmp_path):
    reports = TorchrunReports.in_folder(tmp_path)
    caller = {"PATH": "/usr/bin", "KEEP": "me"}
    plain = step_environment(caller, tmp_path / "state", PYTHON, None, "run-1", warm_start=True)
    assert plain == {
        "PATH": "/venv/bin:/usr/bin", "KEEP": "me", "RETRAIN_HOME": str(tmp_path / "state"),
        "RETRAIN_PIPELINE_RUN": "run-1",
    }  # fmt: skip
    distributed = step_environment(caller, tmp_path, PYTHON, reports, "run-1", warm_start=True)
    assert distributed["OMP_NUM_THREADS"] == "1"
    assert distributed["TORCHELASTIC_ERROR_FILE"] == str(tmp_path / "torchelastic-error.json")
    assert (
        step_environment({**caller, "OMP_NUM_THREADS": "4"}, tmp_path, PYTHON, reports, "r", warm_start=True)[
            "OMP_NUM_THREADS"
        ]
        == "4"
    )


def test_with_warm_starts_off_a_step_is_told_so_and_its_launcher_forks_nothing(tmp_path):
    # RunnerOptions(warm_start=False) with no RETRAIN_WARM_START in the caller's environment: the step's
    # own launcher reads the variable, so the runner sets it.
    cold = step_environment({"PATH": "/usr/bin"}, tmp_path, PYTHON, None, "run-1", warm_start=False)
    assert warm_start_setting(cold) is False
    warm = step_environment({"PATH": "/usr/bin"}, tmp_path, PYTHON, None, "run-1", warm_start=True)
    assert warm_start_setting(warm) is True


def _report(path: Path, message: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"message": message}))


def test_torchruns_error_file_names_the_steps_exit_code(tmp_path):
    reports = TorchrunReports.in_folder(tmp_path)
    assert exit_code_from(1, reports) == 1  # no report at all
    _report(reports.error_file, {"message": "ChildFailedError", "errorCode": 75})
    assert exit_code_from(1, reports) == 75
    assert exit_code_from(0, reports) == 0
    assert exit_code_from(1, None) == 1


def test_when_torchrun_itself_was_signalled_its_workers_reports_decide(tmp_path):
    reports = TorchrunReports.in_folder(tmp_path)
    _report(reports.error_file, {"message": "SignalException: Process 7 got signal: 15"})
    worker = reports.log_dir / "run_x" / "attempt_0"
    _report(worker / "0" / "error.json", {"message": "preempted", "errorCode": 75})
    _report(worker / "1" / "error.json", {"message": "preempted", "errorCode": 75})
    assert exit_code_from(1, reports) == 75
    _report(worker / "1" / "error.json", {"message": "crashed", "errorCode": 3})
    assert exit_code_from(1, reports) == 1  # the workers disagree: torchrun's own code stands
    reports.clear()
    assert not reports.error_file.exists() and not reports.log_dir.exists()
    _report(reports.error_file, "a newer format: a plain string")
    assert exit_code_from(1, reports) == 1
