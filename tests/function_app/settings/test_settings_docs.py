"""The settings' documentation: local.settings.json.example is strict JSON (the Functions extension of VS
Code and `az functionapp config appsettings set --settings @file` accept nothing else), and the settings
reference table (docs/configuration.md) has a row for every RETRAIN_* setting the front door reads and every
example value."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
# Where the front door's settings are named: AppSettings.from_environ reads them through these modules
# (the two Azure ML datastores' names are kept beside the code that uses them, as the cost settings' are,
# and RETRAIN_SUBMITTER in the submitter registry).
SETTINGS_SOURCES = (
    *sorted((REPO_ROOT / "function_app" / "settings").glob("*.py")),
    REPO_ROOT / "components" / "cost.py",
    REPO_ROOT / "components" / "submitters.py",
    REPO_ROOT / "components" / "azureml" / "builder.py",
    REPO_ROOT / "components" / "azureml" / "data_assets.py",
)
SETTING_NAME = re.compile(r"[\"'](RETRAIN_[A-Z0-9]+(?:_[A-Z0-9]+)*)[\"']")
# RETRAIN_MODELS and RETRAIN_MODELS_DIR choose the served models (function_app/settings/models.py).
MODEL_SETTINGS = ("RETRAIN_MODELS", "RETRAIN_MODELS_DIR")


def _table_settings() -> set[str]:
    """The names in the first column of the settings reference table, the one list of them."""
    page = (REPO_ROOT / "docs" / "configuration.md").read_text()
    section = page.split("## Settings reference", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            names |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row.split("|")[1]))
    return names


def test_the_example_is_strict_json():
    document = json.loads((REPO_ROOT / "local.settings.json.example").read_text())

    assert document["IsEncrypted"] is False
    assert all(isinstance(value, str) for value in document["Values"].values())


def test_every_setting_the_front_door_reads_has_a_row_in_the_settings_reference():
    read = {name for path in SETTINGS_SOURCES for name in SETTING_NAME.findall(path.read_text())}
    found_some = {
        "RETRAIN_LEDGER",
        "RETRAIN_PIPELINE_PARAMETERS",
        "RETRAIN_GPU_HOUR_PRICE",
        "RETRAIN_SUBMITTER",
    }
    assert found_some <= read

    assert sorted(read - _table_settings()) == []
    assert sorted(set(MODEL_SETTINGS) - _table_settings()) == []


def test_every_example_value_has_a_row_in_the_settings_reference():
    values = json.loads((REPO_ROOT / "local.settings.json.example").read_text())["Values"]

    assert sorted(set(values) - _table_settings()) == []
