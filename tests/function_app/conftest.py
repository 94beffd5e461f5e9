"""Fixtures for the front door's Functions-level tests: the app as the worker indexes it (once per process:
`FunctionApp.get_functions()` is not idempotent), and front doors started from app settings, the way the
root entry starts one, each with its own state folder and local ledger."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from helpers.function_app.front_door_settings import app_settings

from function_app import runtime
from function_app.service import FrontDoor

ENTRY_MODULE = "function_entry"


@pytest.fixture(name="app_settings")
def app_settings_fixture() -> Callable[..., dict[str, str]]:
    """`app_settings(home, **overrides)`, for tests that start the front door their own way."""
    return app_settings


@pytest.fixture(scope="session")
def indexed_functions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The root entry's functions by name, as the worker indexes them: import it (its start-up reads the
    app settings from the environment), then `app.get_functions()`, once for the whole session."""
    home = tmp_path_factory.mktemp("entry-home")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in app_settings(home).items():
            patch.setenv(name, value)
        entry = sys.modules.get(ENTRY_MODULE) or importlib.import_module(ENTRY_MODULE)
    return {function.get_function_name(): function for function in entry.app.get_functions()}


@pytest.fixture
def handler(indexed_functions: Mapping[str, Any]) -> Callable[[str], Callable[..., Any]]:
    """The user function the worker invokes for an indexed function name."""
    return lambda name: indexed_functions[name].get_user_function()


@pytest.fixture
def start_front_door(tmp_path: Path) -> Callable[..., FrontDoor]:
    """Starts this process's front door (the one every handler reaches, as after the root entry's start-up)
    from app settings in this test's own state folder; keyword arguments override settings."""
    return lambda **overrides: runtime.start(app_settings(tmp_path / "home", **overrides))
