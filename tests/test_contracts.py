"""The component YAMLs and the training code they call agree: flags, defaults and the gate policy.

components/ knows training/ only by the command lines in its YAMLs; these tests are where the two rooms
meet, so a renamed flag or a drifted default fails here instead of in a pipeline run.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import fields

import pytest

from components.specs import COMPONENTS_DIR, load_component_spec
from training.cli import build_parser
from training.config import TrainConfig
from training.gate import GatePolicy
from training.train_args import add_train_arguments

STEPS = ("prep", "train", "evaluate", "register")
_SAMPLE = {
    "uri_folder": "/data/x",
    "uri_file": "/data/x.json",
    "string": "text",
    "integer": "3",
    "number": "0.5",
}


def _rendered(step: str) -> list[str]:
    """The step's command with every input and output filled, optional parts included."""
    spec = load_component_spec(COMPONENTS_DIR / f"{step}.yml")
    command = spec.command.replace("$[[", "").replace("]]", "")
    for name, port in {**spec.inputs, **spec.outputs}.items():
        value = str(port.default) if port.default is not None else _SAMPLE[port.type]
        kind = "outputs" if name in spec.outputs else "inputs"
        command = command.replace(f"${{{{{kind}.{name}}}}}", value)
    return shlex.split(command)


def _parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    if argv[:3] == ["python", "-m", "training.worker"]:
        parser = argparse.ArgumentParser()
        add_train_arguments(parser)
        return parser, argv[3:]
    assert argv[:3] == ["python", "-m", "training.cli"]
    return build_parser(), argv[3:]


@pytest.mark.parametrize("step", STEPS)
def test_every_component_command_parses_with_the_training_cli(step):
    parser, arguments = _parser_for(_rendered(step))
    parser.parse_args(arguments)  # argparse exits (SystemExit) on an unknown or malformed flag


def test_train_component_defaults_are_the_trainers_defaults():
    spec = load_component_spec(COMPONENTS_DIR / "train.yml")
    defaults = {field.name: field.default for field in fields(TrainConfig)}
    for name, port in spec.inputs.items():
        if port.default is not None and name in defaults:
            assert float(port.default) == float(defaults[name]), name


def test_register_component_defaults_are_the_gate_policys_defaults():
    spec = load_component_spec(COMPONENTS_DIR / "register.yml")
    declared = {name: str(port.default).lower() for name, port in spec.inputs.items()}
    for name, value in GatePolicy().describe().items():
        assert declared[name] == value, name
