"""Start-up checks every served model's gate policy against its built-in task's metrics, without torch: a
metric the task does not report stops start-up in one line naming the model, the metric and the task's
metrics, before any event is accepted or any budget spent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.function_app.front_door_settings import app_settings

from function_app.settings.app import AppSettings, SettingsError

REPO_ROOT = Path(__file__).resolve().parents[3]
IMPORT_TIMEOUT_S = 60
TABULAR_METRICS = (
    "expected one of accuracy (higher is better), macro_f1 (higher is better), loss (lower is better), "
    "recall_* (higher is better)"
)


def _served(home: Path, gate: str, task: str = "tabular", **overrides: str) -> dict[str, str]:
    """App settings serving one model, `digits`, from home/models/digits.toml with this [gate] table."""
    folder = home / "models"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "digits.toml").write_text(
        f'[task]\nref = "{task}"\n\n[gate]\n{gate}\n\n[trigger]\nprefix = "digits"\n'
    )
    environ = app_settings(home, RETRAIN_MODELS="digits", RETRAIN_MODELS_DIR=str(folder), **overrides)
    for single in ("RETRAIN_MODEL_NAME", "RETRAIN_BLOB_PREFIX"):
        environ.pop(single)
    return environ


@pytest.mark.parametrize(
    ("gate", "task", "message"),
    [
        ('primary_metric = "f1"', "tabular", "primary_metric names metric 'f1'"),
        ("floors = { acuracy = 0.8 }", "tabular", "floors names metric 'acuracy'"),
        ('max_regression = { "precision_*" = 0.1 }', "image", r"max_regression names metric 'precision_\*'"),
        ("first_model_floors = { mse = 0.5 }", "image", "first_model_floors names metric 'mse'"),
    ],
)
def test_a_gate_metric_its_built_in_task_does_not_report_stops_start_up_naming_the_model(
    tmp_path, gate, task, message
):
    with pytest.raises(
        SettingsError, match=rf"^model 'digits' \(.*digits\.toml \[gate\], task '{task}'\): {message}, "
    ):
        AppSettings.from_environ(_served(tmp_path, gate, task))


def test_a_pipeline_parameter_naming_a_metric_the_task_lacks_is_checked_as_the_run_would_submit_it(tmp_path):
    # RETRAIN_PIPELINE_PARAMETERS wins over the file's [gate] in every run: so it does at start-up.
    environ = _served(
        tmp_path, 'primary_metric = "macro_f1"', RETRAIN_PIPELINE_PARAMETERS="primary_metric=f1"
    )
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ(environ)
    assert "[gate] with RETRAIN_PIPELINE_PARAMETERS" in str(raised.value)
    assert "primary_metric names metric 'f1'" in str(raised.value)
    # ... and a family is no primary metric, though the task reports its members.
    with pytest.raises(SettingsError, match=r"primary_metric 'recall_\*' is a family of metrics"):
        AppSettings.from_environ({**environ, "RETRAIN_PIPELINE_PARAMETERS": "primary_metric=recall_*"})


def test_a_policy_within_the_task_s_metrics_starts(tmp_path):
    gate = (
        'primary_metric = "accuracy"\nfloors = { loss = 1.5 }\n'
        'max_regression = { "recall_*" = 0.1, recall_3 = 0.05 }\nfirst_model_floors = { macro_f1 = 0.5 }'
    )
    (route,) = AppSettings.from_environ(_served(tmp_path, gate)).models
    assert route.parameters["primary_metric"] == "accuracy"


def _served_with(
    home: Path, gate: str, options: str = "", pipeline: str = "", **overrides: str
) -> dict[str, str]:
    """`_served`, with [task.options] and [pipeline] tables too."""
    environ = _served(home, gate, **overrides)
    path = home / "models" / "digits.toml"
    text = path.read_text().replace("\n\n[gate]", f"\n\n[task.options]\n{options}\n\n[gate]")
    path.write_text(f"{text}\n[pipeline]\n{pipeline}\n")
    return environ


@pytest.mark.parametrize(
    ("options", "gate", "message"),
    [
        ("n_classes = 10", "floors = { recall_10 = 0.5 }", "floors names metric 'recall_10'"),
        (
            'classes = ["a", "b", "c"]',
            'primary_metric = "recall_3"',
            "primary_metric names metric 'recall_3'",
        ),
        ("", "max_regression = { recall_x = 0.1 }", "max_regression names metric 'recall_x'"),
        ("", "first_model_floors = { recall_01 = 0.5 }", "first_model_floors names metric 'recall_01'"),
    ],
)
def test_a_class_s_recall_the_task_cannot_report_stops_start_up(tmp_path, options, gate, message):
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ(_served_with(tmp_path, gate, options))
    assert rf"{message}, which the task does not report" in str(raised.value)
    assert "\n" not in str(raised.value)
    if options:  # the count the options fix is the one it names
        assert "recall_0 to recall_" in str(raised.value)


def test_a_class_s_recall_within_the_classes_or_unknown_without_data_starts(tmp_path):
    gate = 'primary_metric = "recall_9"\nfloors = { recall_0 = 0.5 }'
    assert AppSettings.from_environ(_served_with(tmp_path / "ten", gate, "n_classes = 10")).models
    # Only the data fixes the digits' class count: the run's pre-run check reads it (tests/components).
    assert AppSettings.from_environ(_served_with(tmp_path / "open", 'primary_metric = "recall_99"')).models


@pytest.mark.parametrize(
    ("options", "pipeline", "setting", "message"),
    [
        (
            "",
            'early_stopping_metric = "validation_f2"',
            "",
            "parameter early_stopping_metric is 'validation_f2'",
        ),
        (
            "n_classes = 10",
            "",
            "validate_every_epochs=1,early_stopping_metric=validation_recall_99",
            "(RETRAIN_PIPELINE_PARAMETERS): parameter early_stopping_metric is 'validation_recall_99'",
        ),
    ],
)
def test_an_early_stopping_metric_the_built_in_task_does_not_report_stops_start_up(
    tmp_path, options, pipeline, setting, message
):
    overrides = {"RETRAIN_PIPELINE_PARAMETERS": setting} if setting else {}
    environ = _served_with(tmp_path, 'primary_metric = "macro_f1"', options, pipeline, **overrides)
    with pytest.raises(SettingsError) as raised:
        AppSettings.from_environ(environ)
    assert str(raised.value).startswith("model 'digits' (")
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert "task 'tabular' does not report it; expected one of validation_accuracy" in str(raised.value)
    # A metric it reports starts.
    good = {
        "RETRAIN_PIPELINE_PARAMETERS": "validate_every_epochs=1,early_stopping_metric=validation_recall_9"
    }
    assert AppSettings.from_environ({**environ, **good}).models


def test_the_root_entry_stops_on_a_bad_gate_metric_in_one_line_without_importing_torch(tmp_path):
    # The real start-up, in a fresh interpreter: what the Functions worker would log, and what it loaded.
    probe = (
        "import json, sys\n"
        "try:\n"
        "    import function_entry\n"
        "    error = None\n"
        "except Exception as failure:\n"
        "    error = f'{type(failure).__name__}: {failure}'\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mlflow'))\n"
        "print(json.dumps({'error': error, 'heavy': heavy}))\n"
    )
    settings = _served(tmp_path, "floors = { acuracy = 0.8 }")
    environ = {key: value for key, value in os.environ.items() if not key.startswith("RETRAIN_")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO_ROOT,
        env={**environ, **settings},
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["heavy"] == []
    error = report["error"]
    assert error is not None and "\n" not in error
    assert error.startswith("SettingsError: model 'digits' (")
    assert f"floors names metric 'acuracy', which the task does not report; {TABULAR_METRICS}" in error
