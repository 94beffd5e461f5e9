"""The pipeline's first step checks the gate policy before it prepares any data: prep.yml's command, as
rendered for a step, refuses a policy naming a metric the task does not report in one line and writes
nothing (on Azure ML no preflight runs before the job), and prepares as before when the policy holds."""

from __future__ import annotations

import json

import pytest

from components.local.commands import render_command
from components.specs import REPO_ROOT, load_component_spec
from core.rejected_inputs import read_report
from training.cli import main
from training.tasks.tabular.task import DIGITS_OPTIONS

GATE_INPUTS = ("primary_metric", "min_improvement", "floors", "max_regression", "first_model_floors")


def _prep_argv(raw, out, **gate) -> list[str]:
    """prep.yml's command for these inputs, as the local runner renders it (Azure ML the same)."""
    prep = load_component_spec(REPO_ROOT / "components" / "prep.yml")
    inputs = {
        **dict.fromkeys(("previous_prepared", *GATE_INPUTS)),  # unset: their optional parts are dropped
        "task": "tabular",
        "task_options": json.dumps(DIGITS_OPTIONS),
        "raw_data": raw,
        "split": "0.8,0.1,0.1",
        **gate,
    }
    outputs = {"prepared_data": out, "rejected_inputs": f"{out}-rejected"}
    argv = render_command(prep.command, inputs, outputs, "prep")
    assert argv[:3] == ["python", "-m", "training.cli"]
    return argv[3:]


@pytest.mark.parametrize(
    ("gate", "message"),
    [
        ({"floors": "acuracy=0.9"}, "floors names metric 'acuracy', which the task does not report"),
        ({"primary_metric": "f1"}, "primary_metric names metric 'f1', which the task does not report"),
    ],
)
def test_prep_refuses_a_gate_metric_the_task_lacks_before_preparing(
    sample_raw, tmp_path, capsys, gate, message
):
    capsys.readouterr()

    code = main(_prep_argv(sample_raw, tmp_path / "out", **gate))

    lines = capsys.readouterr().err.splitlines()
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("retrain: error: the gate policy (task 'tabular'): ")
    assert message in lines[0] and "expected one of accuracy (higher is better)" in lines[0]
    assert not (tmp_path / "out").exists()


def test_prep_with_a_policy_the_task_can_meet_prepares(sample_raw, tmp_path):
    gate = {"primary_metric": "accuracy", "min_improvement": 0.01, "floors": "loss=1.5"}
    gate |= {"max_regression": "recall_*=0.1", "first_model_floors": "macro_f1=0.5"}

    assert main(_prep_argv(sample_raw, tmp_path / "out", **gate)) == 0
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert read_report(tmp_path / "out-rejected") == ()  # every raw file fits, and the report says so


@pytest.mark.parametrize("options", [json.dumps(DIGITS_OPTIONS), "{}"])  # n_classes = 10, or the labels'
def test_prep_refuses_a_class_s_recall_beyond_the_classes_before_preparing(
    sample_raw, tmp_path, capsys, options
):
    capsys.readouterr()

    code = main(_prep_argv(sample_raw, tmp_path / "out", task_options=options, floors="recall_10=0.5"))

    lines = capsys.readouterr().err.splitlines()
    assert code != 0 and len(lines) == 1
    assert "floors names metric 'recall_10', which the task does not report" in lines[0]
    assert "recall_* (higher is better; recall_0 to recall_9 for its 10 classes)" in lines[0]
    assert not (tmp_path / "out").exists()
