"""The gate's confidence is refused, by one rule (core/gate_rules.py), in one line at every room it enters:
the model's configuration file ([gate] confidence), `--param confidence` and the app setting, the pre-run
check, the step commands and the gate policy itself. The component inputs' bounds (min 0, max 1) are
inclusive; the rule is not. So is a confidence its resample count (`bootstrap_resamples`) cannot support."""

from __future__ import annotations

import argparse
import math
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers.function_app.front_door_settings import app_settings

import retrain_cli
from components.errors import ConfigError, SubmissionError
from components.local.commands import render_command
from components.local.plan import pipeline_values, step_input_values
from components.model_config import load_model_config
from components.parameters import check_parameter_texts
from components.preflight import SubprocessPreflight
from components.request import DataRef, RunRequest
from components.specs import load_pipeline_spec
from core.errors import InputError
from core.flags import add_flags, config_from_namespace
from core.gate_rules import (
    CONFIDENCE_EXPECTED,
    GATE_RULES,
    check_gate_parameters,
    minimum_resamples,
    resampling_conflict,
)
from function_app.settings.app import AppSettings, SettingsError
from training.cli import main
from training.gate.evaluate import GateInputs
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


# -- a confidence its resample count cannot support ------------------------------------------------------
# A 95% lower bound is the 5% quantile of the resamples: fewer than 19 hold no value that low (a lone one
# sits at the median). Such a setting could never certify a candidate, so every room refuses it up front.
FEW = "confidence 0.95 with bootstrap_resamples 1: a 95% lower bound is the 5% quantile of the resamples"
NEEDS = "which needs at least 19 of them; raise bootstrap_resamples to 19 or more, or lower confidence"


def test_the_fewest_resamples_a_confidence_needs_follow_from_its_quantile():
    assert [minimum_resamples(c) for c in (0.5, 0.6, 0.75, 0.9, 0.95, 0.975, 0.99, 0.999, 0.9999)] == [
        1, 2, 3, 9, 19, 39, 99, 999, 9999
    ]  # fmt: skip
    assert resampling_conflict(0.95, 19) is None and resampling_conflict("0.95", "1000") is None
    assert resampling_conflict(0.95, 18) is not None
    assert resampling_conflict(None, 1) is None  # no confidence, nothing to certify
    assert resampling_conflict(0.999, None) is None  # the default 1000 suffices up to 0.999
    assert resampling_conflict(0.9999, None) == (
        "confidence 0.9999 with bootstrap_resamples 1000 (the default): a 99.99% lower bound is the 0.01% "
        "quantile of the resamples, which needs at least 9999 of them; raise bootstrap_resamples to 9999 or "
        "more, or lower confidence"
    )


def test_the_pre_run_check_refuses_a_resample_count_the_confidence_cannot_use():
    for given in (
        {"confidence": 0.95, "bootstrap_resamples": 1},
        {"confidence": "0.95", "bootstrap_resamples": "1"},
    ):
        with pytest.raises(InputError, match=f"^parameters: {re.escape(FEW)}, {re.escape(NEEDS)}$"):
            check_gate_parameters(given)
        with pytest.raises(
            SubmissionError, match=f"^preflight: parameters: {re.escape(FEW)}, {re.escape(NEEDS)}$"
        ):
            SubprocessPreflight(python="/nonexistent/python").check(_Request(parameters=given))
    check_gate_parameters({"confidence": 0.95, "bootstrap_resamples": 19})


def test_the_configuration_file_refuses_a_resample_count_its_confidence_cannot_use(tmp_path):
    path = tmp_path / "iris.toml"
    path.write_text("[gate]\nconfidence = 0.95\n\n[pipeline]\nbootstrap_resamples = 1\n")
    with pytest.raises(ConfigError) as raised:
        load_model_config(path, PIPELINE)
    assert str(raised.value) == (
        f"{path}: [gate] confidence 0.95 with [pipeline] bootstrap_resamples 1: a 95% lower bound is the 5% "
        "quantile of the resamples, which needs at least 19 of them; raise [pipeline] bootstrap_resamples to "
        "19 or more, or lower [gate] confidence"
    )
    path.write_text("[gate]\nconfidence = 0.9999\n")  # the default count, 1000, is too few for it
    with pytest.raises(ConfigError, match=r"bootstrap_resamples 1000 \(the default\): .* at least 9999"):
        load_model_config(path, PIPELINE)


def test_retrain_run_refuses_a_resample_count_the_confidence_cannot_use_before_pinning(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RETRAIN_HOME", str(tmp_path / "home"))
    raw = tmp_path / "raw"
    raw.mkdir()
    params = ("--param", "confidence=0.95", "--param", "bootstrap_resamples=1")
    assert retrain_cli.main(["run", "--task", "tabular", "--data", str(raw), *params]) == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith(f"{FEW}, {NEEDS}") and "\n" not in error
    assert not (tmp_path / "home" / "data").exists()


def test_the_evaluate_step_refuses_a_resample_count_its_confidence_cannot_use(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    required = ["--model", "m", "--data", "d", "--out", "o", "--model-name", "digits"]
    assert main(["evaluate", *required, "--confidence", "0.95", "--bootstrap-resamples", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "retrain: error: --confidence 0.95 with --bootstrap-resamples 1: a 95% lower bound is the 5% "
        "quantile of the resamples, which needs at least 19 of them; raise --bootstrap-resamples to 19 or "
        "more, or lower --confidence"
    )
    assert not (tmp_path / "o").exists()
    with pytest.raises(InputError, match=r"^--confidence 0\.95 with --bootstrap-resamples 1: "):
        GateInputs(confidence=0.95, resamples=1)


def test_the_front_door_refuses_at_start_up_a_resample_count_a_model_s_confidence_cannot_use(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "digits.toml").write_text(
        '[task]\nref = "tabular"\n\n[gate]\nconfidence = 0.95\n\n[trigger]\nprefix = "digits"\n'
    )
    environ = app_settings(
        tmp_path,
        RETRAIN_MODELS="digits",
        RETRAIN_MODELS_DIR=str(folder),
        RETRAIN_PIPELINE_PARAMETERS="bootstrap_resamples=1",
    )
    for single in ("RETRAIN_MODEL_NAME", "RETRAIN_BLOB_PREFIX"):
        environ.pop(single)
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ(environ)
    assert str(raised.value) == (
        f"model 'digits' ({folder / 'digits.toml'} with RETRAIN_PIPELINE_PARAMETERS): {FEW}, {NEEDS}"
    )
    # Enough resamples: it starts.
    environ["RETRAIN_PIPELINE_PARAMETERS"] = "bootstrap_resamples=19"
    (route,) = AppSettings.from_environ(environ).models
    assert route.parameters["confidence"] == 0.95
