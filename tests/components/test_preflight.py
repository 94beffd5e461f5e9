"""The preflight: the task loads and the gate names only its metrics, checked before anything is pinned.

The check is the real one (`python -m training.cli check-model` in a process, as the runner and `retrain
submit` run it), on task files written here, and on the built-in tabular task. The checks made here
directly are forked warm, as `retrain run`'s runner starts them (components/local/warm.py), from one starter
for the module: a fresh interpreter per check would import torch each time; those made through `retrain
submit` and the remembered check's refusal start fresh.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.components.task_file import TASK_FILE, write_task_file

from components.azureml import cli as azureml_cli
from components.errors import SubmissionError
from components.local import cli as local_cli
from components.local.warm import WarmLauncher
from components.model_config import MODELS_DIR_VARIABLE
from components.preflight import SubprocessPreflight
from components.run_settings import RunSettings
from components.specs import REPO_ROOT


@pytest.fixture(scope="module")
def warm() -> Iterator[WarmLauncher]:
    launcher = WarmLauncher(sys.executable)
    launcher.warm_up(REPO_ROOT, os.environ)
    yield launcher
    launcher.close()


def flowers(tmp_path: Path, **given) -> RunSettings:
    task = write_task_file(tmp_path / "tasks")
    return RunSettings(model_name="flowers", task=f"{task}:Flowers", **given)


def test_a_task_that_loads_and_a_policy_it_can_meet_pass_and_the_task_s_facts_come_back(warm, tmp_path):
    run = flowers(
        tmp_path,
        task_options={"width": 3, "note": 'it\'s a "flower" {x}'},
        parameters={"primary_metric": "accuracy", "floors": "loss=1.5", "max_regression": "recall_*=0.1"},
    )
    found = SubprocessPreflight(runner=warm).check(run)
    assert (found.name, found.raw_suffixes, found.primary_metric) == ("flowers", (".csv", ".tsv"), "accuracy")
    assert found.metrics == {
        "accuracy": "higher",
        "macro_f1": "higher",
        "loss": "lower",
        "recall_*": "higher",
    }


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"floors": "acuracy=0.9"}, r"floors names metric 'acuracy', which the task does not report"),
        ({"primary_metric": "mse"}, r"primary_metric names metric 'mse', which the task does not report"),
        ({"max_regression": "precision_*=0.1"}, r"max_regression names metric 'precision_\*'"),
        ({"first_model_floors": "r2=0.5"}, r"first_model_floors names metric 'r2'"),
    ],
)
def test_a_gate_metric_the_task_does_not_report_is_one_line_naming_it(warm, tmp_path, parameters, message):
    with pytest.raises(
        SubmissionError, match=rf"^preflight: models/flowers.toml \[gate\].*{message}"
    ) as raised:
        SubprocessPreflight(runner=warm).check(
            flowers(tmp_path, parameters=parameters), "models/flowers.toml [gate]"
        )
    assert "\n" not in str(raised.value)
    assert "expected one of accuracy (higher is better)" in str(raised.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (TASK_FILE.replace("def drift_features", "def drift_feature"), r"it lacks drift_features\(\)"),
        (TASK_FILE.replace('default_primary_metric = "macro_f1"', 'default_primary_metric = "f1"'),
         r"it lacks default_primary_metric 'f1' among its metrics"),
        ("import not_a_module\n", r"importing .*flowers_task.py failed: ModuleNotFoundError"),
        (TASK_FILE.replace("class Flowers", "class Roses"), r"has no attribute 'Flowers'"),
    ],
)  # fmt: skip
def test_a_task_that_does_not_load_is_one_line_naming_the_task_and_what_is_missing(
    warm, tmp_path, text, message
):
    task = write_task_file(tmp_path, text=text)
    with pytest.raises(SubmissionError, match=rf"^preflight: --task '{task}:Flowers': .*{message}") as raised:
        SubprocessPreflight(runner=warm).check(RunSettings(model_name="flowers", task=f"{task}:Flowers"))
    assert "\n" not in str(raised.value)


def test_an_option_the_task_does_not_take_is_refused(warm, tmp_path):
    with pytest.raises(SubmissionError, match=r"unknown option\(s\) \['colour'\]; this task takes"):
        SubprocessPreflight(runner=warm).check(flowers(tmp_path, task_options={"colour": "red"}))


def test_a_passed_check_is_remembered_for_the_same_task_file_options_and_policy(warm, tmp_path):
    preflight = SubprocessPreflight(runner=warm)
    run = flowers(tmp_path, parameters={"floors": "accuracy=0.5"})
    first = preflight.check(run, "one place")
    preflight.python = str(tmp_path / "no-python")  # any new check would now fail to start
    assert preflight.check(run, "another place") == first
    with pytest.raises(SubmissionError, match=r"preflight of task .*: could not run the check"):
        preflight.check(flowers(tmp_path, parameters={"floors": "accuracy=0.6"}))


def test_an_early_stopping_metric_the_task_does_not_report_is_refused_in_one_line(warm, tmp_path):
    preflight = SubprocessPreflight(runner=warm)
    stopping = {"validate_every_epochs": "1", "early_stopping_metric": "validation_recall_3"}
    assert preflight.check(flowers(tmp_path, parameters=stopping)).name == "flowers"  # a family member
    with pytest.raises(SubmissionError) as raised:  # the check remembered: the metric is checked anew
        preflight.check(flowers(tmp_path, parameters={**stopping, "early_stopping_metric": "validation_f2"}))
    assert str(raised.value) == (
        "preflight: parameter early_stopping_metric is 'validation_f2': task 'flowers' does not report it; "
        "expected one of validation_accuracy, validation_loss, validation_macro_f1, validation_recall_*"
    )


# -- before anything is pinned or run ------------------------------------------------------------------


def handler_args(register, argv: list[str], state: Path, models: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="retrain")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.state_root, args.environ = state, {MODELS_DIR_VARIABLE: str(models)}
    return args


@pytest.mark.parametrize("task", ["tabular", "file"])
def test_a_bad_gate_metric_in_the_configuration_is_refused_before_the_prep_step_runs(
    tmp_path, task, sample_raw
):
    models = tmp_path / "models"
    ref = "tabular" if task == "tabular" else f"{write_task_file(models).name}:Flowers"
    (models / "flowers.toml").parent.mkdir(parents=True, exist_ok=True)
    (models / "flowers.toml").write_text(f'[task]\nref = "{ref}"\n[gate]\nfloors = {{ acuracy = 0.9 }}\n')
    state = tmp_path / "state"
    args = handler_args(
        local_cli.register_commands,
        ["run", "--model-name", "flowers", "--data", str(sample_raw)],
        state,
        models,
    )

    with pytest.raises(SubmissionError) as raised:
        args.handler(args, io.StringIO())

    message = str(raised.value)
    assert message.startswith(f"preflight: {models / 'flowers.toml'} [gate] (task ")
    assert "floors names metric 'acuracy', which the task does not report" in message
    assert "\n" not in message
    assert not state.exists()  # no data pinned, no run recorded, no prep step output


def test_submit_refuses_a_bad_gate_metric_before_recording_or_submitting(tmp_path):
    models = tmp_path / "models"
    task = write_task_file(models)
    (models / "flowers.toml").write_text(
        f'[task]\nref = "{task.name}:Flowers"\n[gate]\nprimary_metric = "r2"\n'
    )
    state = tmp_path / "state"
    argv = [
        "submit",
        "--dry-run",
        "--data",
        "azureml:flowers-raw:rd-0123456789abcdef",
        "--model-name",
        "flowers",
    ]
    args = handler_args(azureml_cli.register_commands, argv, state, models)

    with pytest.raises(
        SubmissionError, match=r"Flowers'\): primary_metric names metric 'r2', which the task does not report"
    ):
        args.handler(args, out=io.StringIO())
    assert not state.exists()


# -- a class's metric, against the classes the task has --------------------------------------------------


def test_a_class_s_metric_beyond_the_data_s_classes_is_refused_before_anything_is_pinned(
    tmp_path, sample_raw
):
    # The digits' 10 classes are known only from their labels: the pre-run check reads them from --data.
    state = tmp_path / "state"
    argv = ["run", "--task", "tabular", "--data", str(sample_raw), "--param", "primary_metric=recall_99"]
    args = handler_args(local_cli.register_commands, argv, state, tmp_path)

    with pytest.raises(SubmissionError) as raised:
        args.handler(args, io.StringIO())

    assert str(raised.value) == (
        "preflight: the gate policy (--param primary_metric) (task 'tabular'): primary_metric names metric "
        "'recall_99', which the task does not report; expected one of accuracy (higher is better), "
        "macro_f1 (higher is better), loss (lower is better), recall_* (higher is better; recall_0 to "
        "recall_9 for its 10 classes)"
    )
    assert not state.exists()  # no data pinned, no run recorded, nothing trained


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"floors": "recall_10=0.5"}, r"floors names metric 'recall_10', which the task does not report"),
        (
            {"validate_every_epochs": "1", "early_stopping_metric": "validation_recall_99"},
            r"^preflight: parameter early_stopping_metric is 'validation_recall_99': task 'tabular' does not "
            r"report it; expected one of validation_accuracy, .*, validation_recall_\*$",
        ),
        (
            {"floors": "recall_07=0.5"},
            r"floors names metric 'recall_07'",
        ),  # no class index, whatever the data
        ({"max_regression": "recall_x=0.1"}, r"max_regression names metric 'recall_x'"),
    ],
)
def test_each_form_of_a_class_s_metric_is_checked_against_the_classes(warm, sample_raw, parameters, message):
    with pytest.raises(SubmissionError, match=message) as raised:
        SubprocessPreflight(runner=warm).check(
            RunSettings(model_name="digits", parameters=parameters), raw=sample_raw
        )
    assert "\n" not in str(raised.value)


def test_the_raw_data_is_read_only_when_a_class_s_metric_needs_its_class_count(warm, sample_raw):
    preflight = SubprocessPreflight(runner=warm)
    family = RunSettings(model_name="digits", parameters={"max_regression": "recall_*=0.1"})
    assert preflight.check(family, raw=sample_raw).class_count is None  # the family needs no count
    member = RunSettings(model_name="digits", parameters={"floors": "recall_9=0.5"})
    assert preflight.check(member, raw=sample_raw).class_count == 10
    # Options that fix the count answer without the data (whose labels say 10).
    three = RunSettings(
        model_name="iris", task_options={"n_classes": 3}, parameters={"floors": "recall_2=0.5"}
    )
    assert preflight.check(three, raw=sample_raw).class_count == 3
    beyond = RunSettings(
        model_name="iris", task_options={"n_classes": 3}, parameters={"floors": "recall_3=0.5"}
    )
    with pytest.raises(
        SubmissionError, match=r"floors names metric 'recall_3', .*recall_0 to recall_2 for its 3"
    ):
        preflight.check(beyond)  # without data too
