"""Every component YAML's `command:` against the config dataclass its command's flags come from.

The local runner executes the very same command lines as Azure ML, so a flag a YAML passes that the command
does not define, an input of a type its field cannot read, or a required field left out fails here rather
than in a step. And a config written as flags (what `retrain train` hands its torchrun workers) reads back
as the same config.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import typing
from pathlib import Path

import pytest
import yaml

from core.flags import add_flags, config_from_namespace, config_to_argv, flag_fields, flag_name, flag_of
from training.data.prepare_config import PrepareConfig
from training.drift.options import DriftConfig
from training.engine.config import TrainConfig
from training.gate.options import EvaluateConfig, GatePolicyOptions, RegisterConfig

COMPONENTS = Path(__file__).resolve().parents[1] / "components"
CONFIGS = {
    "prep.yml": ("python -m training.cli prepare", PrepareConfig),
    "train.yml": ("python -m training.engine.worker", TrainConfig),
    "evaluate.yml": ("python -m training.cli evaluate", EvaluateConfig),
    "register.yml": ("python -m training.cli register", RegisterConfig),
    "drift.yml": ("python -m training.cli drift", DriftConfig),
}
# What a field of each Python type can read from an input of each Azure ML type: every flag reads text,
# so a string input fits any field; the others only their own kind.
_READS = {"uri_folder": (Path, str), "integer": (int,), "number": (float,), "boolean": (bool,)}
_INPUT = re.compile(r"^\$\{\{(inputs|outputs)\.(\w+)\}\}$")
_OPTIONAL_GROUP = re.compile(r"\$\[\[(.*?)\]\]")


def _spec(name: str) -> dict:
    return yaml.safe_load((COMPONENTS / name).read_text())


def _passed(command: str, prefix: str) -> list[tuple[str, str, bool]]:
    """(flag, value text, optional) for each flag the command passes, `$[[...]]` groups optional."""
    assert command.startswith(prefix), f"command {command[:60]!r}: expected to start {prefix!r}"
    rest = command[len(prefix) :]
    passed = []
    for optional, text in [(True, group) for group in _OPTIONAL_GROUP.findall(rest)] + [
        (False, _OPTIONAL_GROUP.sub(" ", rest))
    ]:
        words = shlex.split(text)
        assert len(words) % 2 == 0, f"{text!r}: expected --flag value pairs"
        passed += [(words[i], words[i + 1], optional) for i in range(0, len(words), 2)]
    return passed


def _field_types(config_class: type, field: dataclasses.Field) -> set[type]:
    hint = typing.get_type_hints(config_class)[field.name]
    return {kind for kind in typing.get_args(hint) or (hint,) if kind is not type(None)}


def _owner(config_class: type, field: dataclasses.Field) -> type:
    return next(owner for owner, each in flag_fields(config_class) if each is field)


def _read(config_class: type, field: dataclasses.Field, text: str):
    spec = flag_of(field)
    value = spec.parse(text) if spec.parse else text
    return spec.read(value) if spec.read else value


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_flag_a_component_passes_is_its_config_s_with_a_readable_input(name):
    prefix, config_class = CONFIGS[name]
    spec = _spec(name)
    fields = {flag_name(field): field for _, field in flag_fields(config_class)}
    passed = _passed(spec["command"], prefix)
    for flag, value, _ in passed:
        assert flag in fields, f"{name}: {flag} is no flag of {config_class.__name__}"
        field = fields[flag]
        owner = _owner(config_class, field)
        found = _INPUT.match(value)
        if found is None:  # a literal, such as `--progress log`
            _read(owner, field, value)
            continue
        kind, input_name = found.groups()
        declared = spec[kind][input_name]
        if kind == "inputs" and declared["type"] in _READS:
            assert _field_types(owner, field) & set(_READS[declared["type"]]), (
                f"{name}: {flag} takes {declared['type']} input {input_name}; "
                f"{owner.__name__}.{field.name} is {_field_types(owner, field)}"
            )
        if kind == "outputs":
            assert declared["type"] == "uri_folder" and _field_types(owner, field) & {Path, str}
        default = dataclasses.MISSING if kind == "outputs" else declared.get("default")
        if default is not None and field.default not in (None, dataclasses.MISSING):
            # A component's default is its command's: the YAML's reads as the config's own. (A command whose
            # default is None, such as evaluate's task, means "what the model records"; the pipeline always
            # passes one.)
            assert _read(owner, field, str(default)) == _read(owner, field, str(field.default)), (
                f"{name}: input {input_name} defaults to {default!r}; {field.name} to {field.default!r}"
            )


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_an_input_s_enum_is_its_flag_s_choices(name):
    # Azure ML refuses a value outside an input's enum before the step starts, and the local rooms refuse
    # by it too (components/local/plan.py): it must be what the command itself accepts, no more, no less.
    prefix, config_class = CONFIGS[name]
    spec = _spec(name)
    fields = {flag_name(field): field for _, field in flag_fields(config_class)}
    for flag, value, _ in _passed(spec["command"], prefix):
        found = _INPUT.match(value)
        if found is None or found.group(1) != "inputs":
            continue
        declared = spec["inputs"][found.group(2)]
        if "enum" in declared:
            choices = flag_of(fields[flag]).choices
            assert choices is not None and declared["enum"] == list(choices), (
                f"{name}: input {found.group(2)} has enum {declared['enum']}; {flag} takes {choices}"
            )


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_required_field_is_passed_unconditionally(name):
    prefix, config_class = CONFIGS[name]
    always = {flag for flag, _, optional in _passed(_spec(name)["command"], prefix) if not optional}
    required = {
        flag_name(field)
        for _, field in flag_fields(config_class)
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    }
    assert required <= always, f"{name}: {sorted(required - always)} required but not always passed"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_an_optional_input_is_passed_only_in_an_optional_group(name):
    prefix, _ = CONFIGS[name]
    spec = _spec(name)
    for flag, value, optional in _passed(spec["command"], prefix):
        found = _INPUT.match(value)
        if found and found.group(1) == "inputs" and spec["inputs"][found.group(2)].get("optional"):
            assert optional, f"{name}: optional input {found.group(2)} passed outside $[[...]] ({flag})"


def _round_trip(config):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_flags(parser, type(config))
    return config_from_namespace(type(config), parser.parse_args(config_to_argv(config)))


@pytest.mark.parametrize(
    "config",
    [
        TrainConfig(data=Path("/d"), out=Path("/o"), checkpoints="/c"),
        TrainConfig(
            data=Path("/d a"),
            out=Path("/o"),
            checkpoints="https://account.blob.core.windows.net/c/p",
            learning_rate=1e-5,
            grad_clip_norm=0.5,
            accumulate_grad_batches=4,
            precision="bf16-mixed",
            strategy="fsdp",
            checkpoint_layout="sharded",
            task="tasks/house.py:HousePrices",
            task_options={"size": [16, 8], "name": "a b", "flag": False},
            checkpoint_every_steps=7,
            checkpoint_every_seconds="auto",
            mtbe_hours=0.5,
            deterministic=True,
            allow_data_change=True,
            device="cpu",
            progress="jsonl",
            mlflow_tracking_uri="sqlite:///x.db",
            mlflow_artifact_location=None,
        ),
        TrainConfig(data=Path("/d"), out=Path("/o"), checkpoints="/c", checkpoint_every_seconds=None),
        PrepareConfig(raw=Path("/r"), out=Path("/o")),
        PrepareConfig(
            raw=Path("/r"),
            out=Path("/o"),
            previous=Path("/p"),
            split="0.7,0.2,0.1",
            task="image",
            task_options={"size": 16},
            policy=GatePolicyOptions(
                primary_metric="accuracy",
                min_improvement=0.01,
                floors="none",
                bootstrap_unloadable_champion=True,
            ),
        ),
        EvaluateConfig(model=Path("/m"), data=Path("/d"), out=Path("/o"), model_name="digits"),
        RegisterConfig(
            model=Path("/m"),
            evaluation=Path("/e"),
            data=Path("/d"),
            raw_data_version="rd-1",
            environment_version="3",
            out=Path("/o"),
            model_name="digits",
            task="tabular",
            task_options={"hidden_width": 128},
            lock="https://account.blob.core.windows.net/locks",
            lock_wait=1.5,
            policy=GatePolicyOptions(max_regression="recall_*=0.05", first_model_floors="accuracy=0.5"),
        ),
        DriftConfig(model_name="digits", current=Path("/c")),
        DriftConfig(
            model_name="digits",
            current=Path("/c"),
            reference=Path("/r"),
            psi_threshold=0.25,
            ks_pvalue=0.05,
            min_drifted_features=2,
            bins=20,
            out=Path("/o"),
            publish=False,
            mlflow_tracking_uri="off",
        ),
    ],
    ids=lambda config: type(config).__name__,
)
def test_a_config_written_as_flags_reads_back_as_the_same_config(config):
    assert _round_trip(config) == config
