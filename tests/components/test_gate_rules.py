"""The gate's confidence is refused, by one rule (core/gate_rules.py), in one line at every room it enters:
the model's configuration file ([gate] confidence), `--param confidence` and the app setting, the pre-run
check, the step commands and the gate policy itself. The component inputs' bounds (min 0, max 1) are
inclusive; the rule is not."""

from __future__ import annotations

import argparse
import math
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pytest

import retrain_cli
from components.errors import ConfigError, SubmissionError
from components.local.commands import render_command
from components.local.plan import check_parameter_texts, pipeline_values, step_input_values
from components.model_config import load_model_config
from components.preflight import SubprocessPreflight
from components.request import DataRef, RunRequest
from components.specs import load_pipeline_spec
from core.errors import InputError
from core.flags import add_flags, config_from_namespace
from core.gate_rules import CONFIDENCE_EXPECTED, GATE_RULES
from training.cli import main
from training.gate.options import EvaluateConfig, RegisterConfig
from training.gate.policy import GatePolicy

PIPELINE = load_pipeline_spec()
DATA = DataRef("rd-0123456789abcdef", "/data/raw")
EXPECTED = "a number between 0 and 1, exclusive, such as 0.95"

# (the TOML value, the text of --param, the value a policy is given)
REFUSED = [
    ("1", "1", 1.0),
    ("0", "0", 0.0),
    ("1.5", "1.5", 1.5),
    ("-0.05", "-0.05", -0.05),
    ("nan", "nan", math.nan),
    ("inf", "inf", math.inf),
]
IDS = [text for _, text, _ in REFUSED]


def test_the_expected_form_is_the_rule_s():
    assert CONFIDENCE_EXPECTED == EXPECTED == GATE_RULES["confidence"].expected


@pytest.mark.parametrize(("toml", "text", "value"), REFUSED, ids=IDS)
def test_the_configuration_file_refuses_it_in_one_line(tmp_path, toml, text, value):
    path = tmp_path / "iris.toml"
    path.write_text(f"[gate]\nconfidence = {toml}\n")
    read = tomllib.loads(f"x = {toml}")["x"]  # 1 is an int in TOML, 1.5 a float
    with pytest.raises(ConfigError) as raised:
        load_model_config(path, PIPELINE)
    shown = f"{type(read).__name__} {read!r}"
    assert str(raised.value) == f"{path}: [gate] confidence is {shown}; expected {EXPECTED}"


@pytest.mark.parametrize(("toml", "shown"), [('"0.95"', "'0.95'"), ("true", "bool True"), ("[0.9]", "list")])
def test_the_configuration_file_wants_a_number_not_text(tmp_path, toml, shown):
    path = tmp_path / "iris.toml"
    path.write_text(f"[gate]\nconfidence = {toml}\n")
    with pytest.raises(ConfigError, match=rf"\[gate\] confidence is {shown}.*; expected {EXPECTED}$"):
        load_model_config(path, PIPELINE)


def test_a_good_confidence_in_the_file_reaches_every_step_that_takes_it(tmp_path):
    path = tmp_path / "iris.toml"
    path.write_text("[gate]\nconfidence = 0.95\n")
    config = load_model_config(path, PIPELINE)
    assert config.gate.confidence == 0.95
    assert config.parameters()["confidence"] == 0.95
    takes_it = sorted(name for name, step in PIPELINE.steps.items() if "confidence" in step.component.inputs)
    assert takes_it == ["evaluate", "prep", "register"]


@pytest.mark.parametrize(("toml", "text", "value"), REFUSED, ids=IDS)
def test_param_and_app_settings_text_refuse_it_in_one_line(toml, text, value):
    with pytest.raises(SubmissionError, match=f"^parameter confidence is '{text}'; expected {EXPECTED}$"):
        check_parameter_texts(PIPELINE, {"confidence": text})


@dataclass(frozen=True)
class _Request:
    """What the pre-run check reads of a run (components.preflight.TaskRun)."""

    parameters: dict[str, Any] = field(default_factory=dict)
    task: str = "tabular"
    task_options_text: str = "{}"
    task_sha256: str | None = None


@pytest.mark.parametrize(("toml", "text", "value"), REFUSED, ids=IDS)
def test_the_pre_run_check_refuses_it_before_starting_any_process(toml, text, value):
    # A python that does not exist: reaching the subprocess would fail with another message.
    preflight = SubprocessPreflight(python="/nonexistent/python")
    for given in (value, text):
        with pytest.raises(
            SubmissionError, match=f"^preflight: parameter confidence is .*; expected {EXPECTED}$"
        ):
            preflight.check(_Request(parameters={"confidence": given}))


@pytest.mark.parametrize(("toml", "text", "value"), REFUSED, ids=IDS)
def test_the_gate_policy_refuses_it(toml, text, value):
    with pytest.raises(InputError, match=f"^--confidence {value!r}: expected {EXPECTED}$"):
        GatePolicy(confidence=value)


@pytest.mark.parametrize("command", ["register", "evaluate", "prepare"])
def test_the_step_commands_refuse_it_in_one_line(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    required = {
        "register": [
            *("--model", "m", "--evaluation", "e", "--data", "d", "--raw-data-version", "rd-1"),
            *("--environment-version", "1", "--out", "o", "--model-name", "digits"),
        ],
        "evaluate": ["--model", "m", "--data", "d", "--out", "o", "--model-name", "digits"],
        "prepare": ["--raw", "r", "--out", "o"],
    }[command]
    assert main([command, *required, "--confidence", "1"]) == 2
    assert capsys.readouterr().err.strip() == f"retrain: error: --confidence 1.0: expected {EXPECTED}"
    assert not (tmp_path / "o").exists()


def test_retrain_run_refuses_it_in_one_line_before_pinning_any_data(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RETRAIN_HOME", str(tmp_path / "home"))
    raw = tmp_path / "raw"
    raw.mkdir()
    code = retrain_cli.main(["run", "--task", "tabular", "--data", str(raw), "--param", "confidence=1"])
    assert code == 2
    assert (
        capsys.readouterr().err.strip() == f"retrain: error: parameter confidence is '1'; expected {EXPECTED}"
    )
    assert not (tmp_path / "home" / "data").exists()


@pytest.mark.parametrize("good", [0.95, "0.9", 0.5, 1e-9, 0.999])
def test_a_confidence_inside_zero_to_one_passes_every_room(good):
    assert GATE_RULES["confidence"].fits(good)
    check_parameter_texts(PIPELINE, {"confidence": str(good)})
    assert GatePolicy(confidence=float(good)).confidence == float(good)


def test_the_confidence_and_the_resample_count_reach_the_steps_that_read_them():
    parameters = {"confidence": 0.95, "bootstrap_resamples": 200, "primary_metric": "accuracy"}
    values = pipeline_values(PIPELINE, RunRequest(model_name="digits", data=DATA, parameters=parameters))
    upstream = {("prep", "prepared_data"): "/p", ("train", "model"): "/m", ("evaluate", "evaluation"): "/e"}
    configs = {}
    for step, config_class in (("evaluate", EvaluateConfig), ("register", RegisterConfig)):
        spec = PIPELINE.steps[step]
        inputs = step_input_values(spec, values, parameters, upstream)
        outputs = {name: f"/out/{name}" for name in spec.component.outputs}
        argv = render_command(spec.component.command, inputs, outputs, step)
        parser = argparse.ArgumentParser()
        add_flags(parser, config_class)
        parser.add_argument("--task-option", action="append", default=[])
        configs[step] = config_from_namespace(config_class, parser.parse_args(argv[4:]))
    evaluate, register = configs["evaluate"], configs["register"]
    assert (evaluate.confidence, evaluate.bootstrap_resamples, evaluate.primary_metric) == (
        0.95,
        200,
        "accuracy",
    )
    assert evaluate.bootstrap_seed == 0  # not a pipeline input: recorded, always the same
    assert (register.policy.confidence, register.policy.primary_metric) == (0.95, "accuracy")
    with pytest.raises(
        SubmissionError, match=r"^parameter bootstrap_resamples is '0'; expected a whole number >= 1"
    ):
        check_parameter_texts(PIPELINE, {"bootstrap_resamples": "0"})
