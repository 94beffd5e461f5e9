"""The Function App as the worker sees it: the root entry file it loads, the functions it indexes with their
bindings, and what importing the entry costs (no torch, no mlflow, no azure-ai-ml at cold start)."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ENTRY_SETTING = "PYTHON_SCRIPT_FILE_NAME"
HEAVY_MODULES = ("torch", "mlflow", "azure.ai.ml")
IMPORT_TIMEOUT_S = 60


def _settings_example() -> dict:
    """local.settings.json.example is JSON with whole-line // comments (func's own format); strip them."""
    text = (REPO_ROOT / "local.settings.json.example").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("//")]
    return json.loads("\n".join(lines))


def _bindings(function) -> list[dict]:
    """The bindings as the host receives them in the function's metadata."""
    return json.loads(function.get_function_json())["bindings"]


def test_every_trigger_is_indexed_with_its_bindings(indexed_functions):
    assert sorted(indexed_functions) == [
        "flush_batches",
        "get_retrain",
        "on_blob_created",
        "on_drift_alert",
        "post_retrain",
    ]
    for name in ("on_blob_created", "on_drift_alert"):
        assert _bindings(indexed_functions[name]) == [
            {"direction": "IN", "type": "eventGridTrigger", "name": "event"}
        ]
    routes = {}
    for name in ("post_retrain", "get_retrain"):
        trigger, output = _bindings(indexed_functions[name])
        assert (trigger["type"], trigger["direction"], trigger["name"]) == ("httpTrigger", "IN", "req")
        assert trigger["authLevel"].lower() == "function"  # never anonymous: a key is required
        assert output == {"direction": "OUT", "type": "http", "name": "$return"}
        routes[name] = (trigger["route"], trigger["methods"])
    assert routes == {"post_retrain": ("retrain", ["POST"]), "get_retrain": ("retrain/{id}", ["GET"])}
    [timer] = _bindings(indexed_functions["flush_batches"])
    assert timer == {
        "direction": "IN",
        "type": "timerTrigger",
        "name": "timer",
        "schedule": "*/30 * * * * *",
        "runOnStartup": False,
        "useMonitor": True,
    }


def test_the_root_entry_is_the_file_the_settings_name():
    entry = _settings_example()["Values"][ENTRY_SETTING]
    # The worker's rule: a .py file at the app root (beside host.json), no folders in the name; and not
    # function_app.py, which the package function_app/ would shadow (DESIGN.md).
    assert entry.endswith(".py")
    assert "/" not in entry and "\\" not in entry
    assert entry != "function_app.py"
    assert (REPO_ROOT / entry).is_file()
    assert (REPO_ROOT / "host.json").is_file()
    assert (REPO_ROOT / "function_app" / "__init__.py").is_file()


def test_the_deployment_package_keeps_what_the_entry_needs():
    # A .funcignore pattern that matched the entry would deploy an app with no functions, silently.
    patterns = [
        line.strip().rstrip("/")
        for line in (REPO_ROOT / ".funcignore").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    entry = _settings_example()["Values"][ENTRY_SETTING]
    for kept in (entry, "host.json", "requirements.txt", "function_app", "components"):
        assert not any(fnmatch.fnmatch(kept, pattern) for pattern in patterns), kept
    for left_out in ("training", "tests", "bench", "local.settings.json"):
        assert any(fnmatch.fnmatch(left_out, pattern) for pattern in patterns), left_out


def _import_entry(settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    probe = (
        "import json, sys\n"
        "import function_entry\n"
        f"roots = {HEAVY_MODULES!r}\n"
        "heavy = sorted(m for m in sys.modules if any(m == r or m.startswith(r + '.') for r in roots))\n"
        "print(json.dumps({'heavy': heavy, 'functions': len(function_entry.app.get_functions())}))\n"
    )
    environ = {key: value for key, value in os.environ.items() if not key.startswith("RETRAIN_")}
    return subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO_ROOT,  # the worker runs from the app root, where the entry file is
        env={**environ, **settings},
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize("submitter", ["dry-run", "local", "azureml"])
def test_importing_the_root_entry_loads_no_heavy_sdk(tmp_path, app_settings, submitter):
    settings = app_settings(tmp_path / "home", RETRAIN_SUBMITTER=submitter)
    settings |= {
        "AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000",
        "AZURE_RESOURCE_GROUP": "retrain",
        "AZUREML_WORKSPACE": "retrain-ws",
    }
    result = _import_entry(settings)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"heavy": [], "functions": 5}


def test_an_invalid_setting_stops_start_up_naming_it(tmp_path, app_settings):
    result = _import_entry(app_settings(tmp_path / "home", RETRAIN_COOLDOWN_SECONDS="an hour"))
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("function_app.storage_settings.SettingsError: RETRAIN_COOLDOWN_SECONDS")
    assert "expected a whole number" in last_line
