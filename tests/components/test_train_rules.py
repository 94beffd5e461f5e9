"""A pipeline parameter the trainer would refuse is refused, by the same rule (core/train_rules.py), at
every room it enters: the model's configuration file, `--param`, the pre-run check and the trainer itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import retrain_cli
from components.errors import ConfigError, SubmissionError
from components.local.commands import render_command
from components.local.plan import step_input_values
from components.model_config import load_model_config
from components.parameters import check_parameter_texts
from components.preflight import SubprocessPreflight
from components.specs import load_pipeline_spec
from core.errors import InputError
from core.train_rules import CHECKPOINT_LAYOUTS, STRATEGIES, TRAIN_RULES
from training.engine.config import TrainConfig

PIPELINE = load_pipeline_spec()

# (parameter, TOML value, the text of --param, the trainer's keyword value, the expected form)
REFUSED = [
    ("learning_rate", "0.0", "0.0", 0.0, "a number > 0"),
    ("mtbe_hours", "0", "0", 0.0, "a number of hours > 0"),
    ("checkpoint_every_seconds", '"banana"', "banana", "banana", "a number of seconds > 0, 'auto'"),
    ("early_stopping_patience", "0", "0", 0, "a whole number of validations >= 1"),
    ("early_stopping_metric", '"loss"', "loss", "loss", "validation_<one of the task's metrics>"),
    ("validate_every_epochs", "-1", "-1", -1, "a whole number of epochs >= 1, or 0 or 'off'"),
    ("grad_clip_norm", "0.0", "0", 0.0, "a number > 0"),
    ("accumulate_grad_batches", "0", "0", 0, "a whole number >= 1"),
    ("precision", '"fp16"', "fp16", "fp16", "one of 32, bf16-mixed, 16-mixed"),
    ("strategy", '"zero3"', "zero3", "zero3", "one of ddp, fsdp"),
]
IDS = [name for name, *_ in REFUSED]


@pytest.mark.parametrize(("name", "toml", "text", "value", "expected"), REFUSED, ids=IDS)
def test_the_configuration_file_refuses_in_one_line_what_the_trainer_would(
    tmp_path, name, toml, text, value, expected
):
    path = tmp_path / "iris.toml"
    path.write_text(f"[pipeline]\n{name} = {toml}\n")
    with pytest.raises(ConfigError) as raised:
        load_model_config(path, PIPELINE)
    assert str(raised.value).startswith(f"{path}: [pipeline] {name} is ")
    assert f"; expected {expected}" in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("name", "toml", "text", "value", "expected"), REFUSED, ids=IDS)
def test_param_and_app_settings_text_refuse_it_in_one_line(name, toml, text, value, expected):
    with pytest.raises(SubmissionError, match=f"^parameter {name} is '{text}'; expected {expected}"):
        check_parameter_texts(PIPELINE, {name: text})


@dataclass(frozen=True)
class _Request:
    """What the pre-run check reads of a run (components.preflight.TaskRun)."""

    parameters: Mapping[str, Any] = field(default_factory=dict)
    task: str = "tabular"
    task_options_text: str = "{}"
    task_sha256: str | None = None


@pytest.mark.parametrize(("name", "toml", "text", "value", "expected"), REFUSED, ids=IDS)
def test_the_pre_run_check_refuses_a_request_carrying_it_before_starting_any_process(
    name, toml, text, value, expected
):
    # A python that does not exist: reaching the subprocess would fail with another message.
    preflight = SubprocessPreflight(python="/nonexistent/python")
    for given in (value, text):  # typed (a configuration file's) and text (an app setting's)
        with pytest.raises(SubmissionError, match=f"^preflight: parameter {name} is .*; expected {expected}"):
            preflight.check(_Request(parameters={name: given}))


@pytest.mark.parametrize(("name", "toml", "text", "value", "expected"), REFUSED, ids=IDS)
def test_the_trainer_refuses_it_by_the_same_rule(tmp_path, name, toml, text, value, expected):
    with pytest.raises(InputError, match=f"^{TRAIN_RULES[name].flag} .*: expected {expected}"):
        TrainConfig(data=tmp_path, out=tmp_path / "out", checkpoints=str(tmp_path / "ckpt"), **{name: value})


@pytest.mark.parametrize(
    ("name", "good"),
    [
        ("learning_rate", ["1e-4", 0.5, 3]),
        ("mtbe_hours", ["0.25", 12.0, 1]),
        ("checkpoint_every_seconds", ["auto", "OFF", "none", "300", 300, 0.5, None]),
        ("checkpoint_every_steps", ["off", "10", 10, None]),
        ("epochs", ["3", 3]),
        ("validate_every_epochs", ["0", 0, "off", "2", 2, None]),
        ("validate_every_steps", ["0", "OFF", "25", 25, None]),
        ("early_stopping_metric", ["validation_loss", "validation_recall_3", "off", None]),
        ("early_stopping_patience", ["1", 5]),
        ("early_stopping_min_delta", ["0", 0.01, 0]),
        ("candidate", ["best", "last", "auto"]),
        ("grad_clip_norm", ["1.0", 0.5, 2, "off", None]),
        ("accumulate_grad_batches", ["4", 1]),
        ("precision", ["32", 32, "bf16-mixed", "16-mixed"]),
        ("strategy", ["ddp", "fsdp"]),
    ],
)
def test_what_the_trainer_accepts_passes_every_room(name, good):
    for value in good:
        assert TRAIN_RULES[name].fits(value), value


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("learning_rate", [0, "0", -1e-3, "nan", float("inf"), True, "fast"]),
        ("mtbe_hours", [0, "-2", float("nan")]),
        ("checkpoint_every_seconds", ["banana", 0, "-5", "inf", True]),
        ("epochs", [0, 2.0, "2.5", True]),
        ("keep_checkpoints", [1, "1"]),
        ("validate_every_epochs", [-1, "1.5", True]),
        ("early_stopping_metric", ["loss", "", "validation_", 3]),
        ("early_stopping_patience", [0, "2.5", True]),
        ("early_stopping_min_delta", [-0.1, "nan", True]),
        ("candidate", ["worst", 1]),
        ("grad_clip_norm", [0, "-1", "inf", True]),
        ("accumulate_grad_batches", [0, 2.0, True]),
        ("precision", ["16", "bf16", 16, True]),
        ("strategy", ["FSDP2", "deepspeed", "", 1, True]),
    ],
)
def test_what_the_trainer_refuses_fits_no_rule(name, bad):
    for value in bad:
        assert not TRAIN_RULES[name].fits(value), value


def test_retrain_run_refuses_it_in_one_line_before_pinning_any_data(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RETRAIN_HOME", str(tmp_path / "home"))
    raw = tmp_path / "raw"
    raw.mkdir()
    code = retrain_cli.main(["run", "--data", str(raw), "--task", "tabular", "--param", "learning_rate=0.0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == "retrain: error: parameter learning_rate is '0.0'; expected a number > 0"
    assert not (tmp_path / "home" / "data").exists()


STEP_OPTIONS = ("grad_clip_norm", "accumulate_grad_batches", "precision", "strategy", "checkpoint_layout")


def test_the_step_options_are_pipeline_keys_of_the_same_names_and_reach_the_train_step(tmp_path):
    path = tmp_path / "iris.toml"
    path.write_text(
        '[pipeline]\ngrad_clip_norm = 1.0\naccumulate_grad_batches = 4\nprecision = "bf16-mixed"\n'
        'strategy = "fsdp"\ncheckpoint_layout = "sharded"\n'
    )
    parameters = load_model_config(path, PIPELINE).parameters()
    assert {name: parameters[name] for name in STEP_OPTIONS} == {
        "grad_clip_norm": 1.0,
        "accumulate_grad_batches": 4,
        "precision": "bf16-mixed",
        "strategy": "fsdp",
        "checkpoint_layout": "sharded",
    }
    check_parameter_texts(
        PIPELINE,
        {
            "accumulate_grad_batches": "4",
            "precision": "16-mixed",
            "strategy": "fsdp",
            "checkpoint_layout": "auto",
        },
    )
    train = PIPELINE.steps["train"]
    assert set(STEP_OPTIONS) <= set(train.component.inputs)
    # The train step's command line carries them as the trainer's flags.
    upstream = {("prep", "prepared_data"): Path("prepared")}
    inputs = step_input_values(train, PIPELINE.inputs, parameters, upstream)
    outputs = {"model": Path("model"), "checkpoints": Path("checkpoints")}
    command = render_command(train.component.command, inputs, outputs, "train")
    for flag, value in (
        ("--strategy", "fsdp"),
        ("--checkpoint-layout", "sharded"),
        ("--precision", "bf16-mixed"),
    ):
        assert command[command.index(flag) + 1] == value


def test_a_checkpoint_layout_other_than_the_trainer_s_is_refused_by_the_train_step_s_choices(tmp_path):
    # No trainer rule of its own: the train step's input declares its choices (an `enum`, which Azure ML
    # enforces too), and the configuration file and --param refuse by them.
    path = tmp_path / "iris.toml"
    path.write_text('[pipeline]\ncheckpoint_layout = "shards"\n')
    with pytest.raises(
        ConfigError, match=r"\[pipeline\] checkpoint_layout is .*shards.*; expected one of auto, single"
    ):
        load_model_config(path, PIPELINE)
    with pytest.raises(
        SubmissionError, match=r"^parameter checkpoint_layout is 'shards'; expected one of auto, "
    ):
        check_parameter_texts(PIPELINE, {"checkpoint_layout": "shards"})
    port = PIPELINE.steps["train"].component.inputs["checkpoint_layout"]
    assert port.choices == CHECKPOINT_LAYOUTS  # the trainer's own
    assert PIPELINE.steps["train"].component.inputs["strategy"].choices == STRATEGIES


@pytest.mark.parametrize(
    ("combination", "says"),
    [
        ({"strategy": "fsdp", "checkpoint_layout": "single"}, "checkpoint_layout single with strategy fsdp"),
        ({"strategy": "fsdp", "precision": "16-mixed"}, "precision 16-mixed with strategy fsdp"),
    ],
)
def test_the_pre_run_check_refuses_a_combination_the_trainer_would_before_starting_any_process(
    combination, says
):
    preflight = SubprocessPreflight(python="/nonexistent/python")
    with pytest.raises(SubmissionError, match=f"^preflight: parameters: {says}"):
        preflight.check(_Request(parameters=combination))
