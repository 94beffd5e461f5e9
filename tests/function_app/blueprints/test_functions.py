"""The Function App as the worker sees it: the root entry file it loads, the functions it indexes with their
bindings, and what importing the entry costs (no torch, no mlflow, no azure-ai-ml at cold start)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
ENTRY_SETTING = "PYTHON_SCRIPT_FILE_NAME"
HEAVY_MODULES = ("torch", "mlflow", "azure.ai.ml")
IMPORT_TIMEOUT_S = 60
GIT_TIMEOUT_S = 30
# The front door loads nothing of training/: what it shares with the steps is core/, which it ships whole.
CORE_FILES = tuple(
    sorted(path.relative_to(REPO_ROOT).as_posix() for path in (REPO_ROOT / "core").rglob("*.py"))
)


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
    # function_app.py, which the package function_app/ would shadow (docs/architecture.md).
    assert entry.endswith(".py")
    assert "/" not in entry and "\\" not in entry
    assert entry != "function_app.py"
    assert (REPO_ROOT / entry).is_file()
    assert (REPO_ROOT / "host.json").is_file()
    assert (REPO_ROOT / "function_app" / "__init__.py").is_file()


def _candidates() -> set[str]:
    """The checkout's files, as paths relative to the root; the bulky folders .funcignore must leave out
    (the venv, node_modules, local state, caches) each stand in as one file, and .git not at all."""
    skipped = {
        ".git",
        ".venv",
        ".venv-checkov",
        ".azure-functions-oldest",
        "node_modules",
        ".retrain",
        ".pytest_cache",
        ".ruff_cache",
        "__pycache__",
    }
    found = {
        ".venv/pyvenv.cfg",
        ".venv-checkov/pyvenv.cfg",
        ".azure-functions-oldest/azure/functions/__init__.py",
        "node_modules/azurite/package.json",
        ".retrain/ledger/events/e.json",
        "training/__pycache__/planning.cpython-311.pyc",
        "training/checkpoint/__init__.py",  # a sub-package stays out even if the checkout loses this one
    }
    for folder, folders, files in os.walk(REPO_ROOT):
        folders[:] = [name for name in folders if name not in skipped]
        # In a git worktree .git is a file, not a folder: leave it out all the same.
        kept = (name for name in files if name not in skipped)
        found.update((Path(folder) / name).relative_to(REPO_ROOT).as_posix() for name in kept)
    return found


def _shipped(root: Path, candidates: set[str]) -> set[str]:
    """Which candidates the deployment package keeps, by .funcignore read with gitignore semantics: git
    itself applies the rules to empty stand-ins."""
    for path in candidates:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).touch()
    shutil.copyfile(REPO_ROOT / ".funcignore", root / ".gitignore")
    no_excludes = root.parent / "no-excludes"  # the developer's own global excludes must not count
    no_excludes.touch()
    git = ["git", "-c", f"core.excludesFile={no_excludes}", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True, timeout=GIT_TIMEOUT_S)
    listed = subprocess.run(
        [*git, "ls-files", "--others", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=True,
        timeout=GIT_TIMEOUT_S,
    )
    return set(filter(None, listed.stdout.split("\0")))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return _shipped(tmp_path_factory.mktemp("funcignore") / "app", _candidates())


def test_the_deployment_package_keeps_what_the_entry_needs(shipped):
    entry = _settings_example()["Values"][ENTRY_SETTING]
    # A pattern that matched the entry would deploy an app with no functions, silently.
    kept = {entry, "host.json", "requirements.txt", "function_app/__init__.py", "function_app/service.py"}
    kept |= {"components/cost.py", "components/pipeline.yml", "components/compute/gpu-spot.yml"}
    kept |= {"models/digits.toml", "models/shapes.toml"}  # the served models' files (RETRAIN_MODELS)
    assert kept <= shipped
    # core/ whole, and nothing of training/ (tests/test_architecture.py).
    assert not any(path.startswith("training/") for path in shipped)
    assert {path for path in shipped if path.startswith("core/")} >= set(CORE_FILES)
    left_outs = ("tests", "bench", "docs", ".venv", "node_modules", ".retrain", "local.settings.json")
    left_outs += (".venv-checkov", ".azure-functions-oldest", "infra", "azure.yaml")
    for left_out in (*left_outs, "function_app/local"):
        assert not any(path == left_out or path.startswith(f"{left_out}/") for path in shipped), left_out


def test_the_deployment_package_leaves_the_local_runner_out(shipped):
    # A deployed app submits to Azure ML: the local runner is reached only by its name in the submitter
    # registry, which ships with both Azure ML submitters (tests/test_architecture.py).
    assert [path for path in shipped if path.startswith("components/local/")] == []
    kept = {"components/submitters.py", "components/azureml/submitter.py", "components/azureml/dry_run.py"}
    assert kept <= shipped


def _package(shipped: set[str], package: Path) -> Path:
    """The package as .funcignore leaves it, copied to `package`: the stand-ins for bulky folders have no
    original, and are left out."""
    for path in shipped:
        if (REPO_ROOT / path).is_file():
            (package / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_ROOT / path, package / path)
    return package


AZURE_ML_WORKSPACE = {
    "AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000",
    "AZURE_RESOURCE_GROUP": "retrain",
    "AZUREML_WORKSPACE": "retrain-ws",
}


@pytest.mark.parametrize("submitter", ["dry-run", "azureml"])
@pytest.mark.parametrize("served", ["one model", "models from files"])
def test_the_deployment_package_starts_on_its_own(shipped, tmp_path, app_settings, served, submitter):
    # The package as .funcignore leaves it, run from its own root: a module it lacks fails the import, and
    # a file RETRAIN_MODELS reads that it lacks fails the start-up.
    package = _package(shipped, tmp_path / "package")
    settings = app_settings(tmp_path / "home", RETRAIN_SUBMITTER=submitter, **AZURE_ML_WORKSPACE)
    if served == "models from files":
        del settings["RETRAIN_MODEL_NAME"], settings["RETRAIN_BLOB_PREFIX"]
        settings["RETRAIN_MODELS"] = "digits,shapes"

    result = _import_entry(settings, root=package)

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"heavy": [], "functions": 5, "training": [], "outside": []}


def test_the_deployment_package_refuses_the_local_runner_in_one_line(shipped, tmp_path, app_settings):
    package = _package(shipped, tmp_path / "package")

    result = _import_entry(app_settings(tmp_path / "home", RETRAIN_SUBMITTER="local"), root=package)

    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "function_app.settings.storage.SettingsError: RETRAIN_SUBMITTER=local: this installation does not "
        "ship components/local/ (the deployed Function App leaves it out, .funcignore); set "
        "RETRAIN_SUBMITTER to one of azureml, dry-run"
    )


def _import_entry(settings: dict[str, str], root: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """Import the entry in a fresh interpreter from `root`; report the heavy SDKs and training modules it
    loaded, and which of our modules came from anywhere but `root`."""
    probe = (
        "import json, os, sys\n"
        "import function_entry\n"
        f"roots = {HEAVY_MODULES!r}\n"
        "def under(*names):\n"
        "    return sorted(m for m in sys.modules if any(m == r or m.startswith(r + '.') for r in names))\n"
        "ours = under('function_entry', 'function_app', 'components', 'core', 'training')\n"
        "outside = [m for m in ours if not sys.modules[m].__file__.startswith(os.getcwd() + os.sep)]\n"
        "print(json.dumps({'heavy': under(*roots), 'functions': len(function_entry.app.get_functions()),\n"
        "                  'training': under('training'), 'outside': outside}))\n"
    )
    environ = {key: value for key, value in os.environ.items() if not key.startswith("RETRAIN_")}
    return subprocess.run(
        [sys.executable, "-c", probe],
        cwd=root,  # the worker runs from the app root, where the entry file is
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
    assert report == {"heavy": [], "functions": 5, "training": [], "outside": []}


def test_an_invalid_setting_stops_start_up_naming_it(tmp_path, app_settings):
    result = _import_entry(app_settings(tmp_path / "home", RETRAIN_COOLDOWN_SECONDS="an hour"))
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("function_app.settings.storage.SettingsError: RETRAIN_COOLDOWN_SECONDS")
    assert "expected a whole number" in last_line
