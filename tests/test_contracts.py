"""The component YAMLs and the training code they call agree: flags, defaults and the gate policy.

components/ knows training/ only by the command lines in its YAMLs; these tests are where the two rooms
meet, so a renamed flag or a drifted default fails here instead of in a pipeline run.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from components.specs import (
    COMPONENTS_DIR,
    PIPELINE_FILE,
    ParentInput,
    load_component_spec,
    load_pipeline_spec,
)
from training.cli import build_parser
from training.engine.config import AUTO_INTERVAL, TrainConfig
from training.engine.train_args import add_train_arguments, config_from_args
from training.gate.policy import GatePolicy

STEPS = ("prep", "train", "evaluate", "register", "drift")
_SAMPLE = {
    "uri_folder": "/data/x",
    "uri_file": "/data/x.json",
    "string": "text",
    "integer": "3",
    "number": "0.5",
}
# Inputs whose text has a form of its own (an optional input has no default to render).
_SAMPLE_BY_NAME = {
    "bootstrap_unloadable_champion": "true",
    "task": "tabular",
    "task_options": "{}",
    "candidate": "best",
    "early_stopping_metric": "validation_loss",
}


def _rendered(step: str, values: Mapping[str, object] | None = None) -> list[str]:
    """The step's command with every input and output filled, optional parts included: from `values`,
    else the port's default, else a sample of its type."""
    spec = load_component_spec(COMPONENTS_DIR / f"{step}.yml")
    command = spec.command.replace("$[[", "").replace("]]", "")
    for name, port in {**spec.inputs, **spec.outputs}.items():
        value = (values or {}).get(name, port.default)
        value = str(value) if value is not None else _SAMPLE_BY_NAME.get(name, _SAMPLE[port.type])
        kind = "outputs" if name in spec.outputs else "inputs"
        command = command.replace(f"${{{{{kind}.{name}}}}}", value)
    return shlex.split(command)


def _parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    if argv[:3] == ["python", "-m", "training.engine.worker"]:
        parser = argparse.ArgumentParser()
        add_train_arguments(parser)
        return parser, argv[3:]
    assert argv[:3] == ["python", "-m", "training.cli"]
    return build_parser(), argv[3:]


@pytest.mark.parametrize("step", STEPS)
def test_every_component_command_parses_with_the_training_cli(step):
    parser, arguments = _parser_for(_rendered(step))
    parser.parse_args(arguments)  # argparse exits (SystemExit) on an unknown or malformed flag


def _trainer_config(argv: list[str], data: Path) -> TrainConfig:
    parser, arguments = _parser_for(argv)
    args = parser.parse_args(arguments)
    args.data = data  # the rendered command names a sample path; the config wants a folder that exists
    return config_from_args(args, {}, data)


def test_train_component_defaults_are_the_trainers_defaults(tmp_path):
    spec = load_component_spec(COMPONENTS_DIR / "train.yml")
    defaults = {
        field.name: field.default if field.default is not MISSING else field.default_factory()
        for field in fields(TrainConfig)
        if field.default is not MISSING or field.default_factory is not MISSING
    }
    declared = [name for name, port in spec.inputs.items() if port.default is not None and name in defaults]
    assert {"checkpoint_every_seconds", "mtbe_hours"} <= set(declared)
    config = _trainer_config(_rendered("train"), tmp_path)  # read as the trainer reads them: "300" is 300.0
    for name in declared:
        assert getattr(config, name) == defaults[name], name


def test_the_pipeline_trains_at_the_interval_chosen_from_the_eviction_cost(tmp_path):
    pipeline = load_pipeline_spec(PIPELINE_FILE)
    bound = pipeline.steps["train"].inputs
    values = {port: pipeline.inputs[b.name] for port, b in bound.items() if isinstance(b, ParentInput)}
    assert values["checkpoint_every_seconds"] == AUTO_INTERVAL
    config = _trainer_config(_rendered("train", values), tmp_path)
    assert config.checkpoint_every_seconds == AUTO_INTERVAL
    assert config.mtbe_hours == float(values["mtbe_hours"])


def test_the_register_step_leaves_an_unset_gate_policy_to_the_task():
    # A regression task has no accuracy to bound: every part of the policy is an optional input without a
    # default, so the register step takes the task's defaults for what the model's configuration leaves out.
    spec = load_component_spec(COMPONENTS_DIR / "register.yml")
    for name in GatePolicy().describe():
        assert (spec.inputs[name].optional, spec.inputs[name].default) == (True, None), name


def test_the_digits_configuration_spells_out_the_gate_policys_classifier_defaults():
    from components.model_config import load_model_config

    config = load_model_config(COMPONENTS_DIR.parent / "models" / "digits.toml")
    assert config.gate.parameters() == {
        name: float(value) if name == "min_improvement" else value
        for name, value in GatePolicy().describe().items()
    }
