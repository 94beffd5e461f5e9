"""Which models a front door serves, read from the models' configuration files (components/model_config.py).

    RETRAIN_MODELS=digits,shapes   the files models/digits.toml and models/shapes.toml
    RETRAIN_MODELS=*               every models/*.toml
    unset                          one model: RETRAIN_MODEL_NAME (default digits) with the RETRAIN_BLOB_*
                                   scope and the default task; no configuration file is read

RETRAIN_MODELS_DIR moves the folder (relative to the app root, the working folder). Serving from the files
is asked for, never inferred from the folder's content: the repository ships models/digits.toml and
models/shapes.toml, so "every file when unset" would turn each single-model deployment (and `make demo`,
which sets RETRAIN_BLOB_PREFIX) into a two-model one. Served from files, the single model's settings
(RETRAIN_MODEL_NAME, RETRAIN_BLOB_PREFIX, RETRAIN_BLOB_SUFFIXES) are refused: each file's [trigger] says
them. RETRAIN_BLOB_ACCOUNT and RETRAIN_BLOB_CONTAINER are the default account and container of a file that
names none, and RETRAIN_BLOB_ENDPOINT the endpoint of its account (Azurite, another cloud); any other
account is at https://<account>.blob.core.windows.net. A model with no account and container takes no blob
events (drift alerts and HTTP requests still reach it). Its suffixes are [trigger] suffixes, else its
task's raw files: a built-in's, or the `raw_suffixes` a user's task declares, read from its code without
importing it (components/task_declarations.py); where only running the task could tell, start-up stops
saying so, and the file must name them. Its depth (how many folder levels below the prefix
its blobs may lie) is [trigger] depth, else its built-in task's (the image task's class folders: 2), else 1.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from components.errors import PipelineError
from core.names import is_model_name
from core.text import quoted
from function_app.settings.models import ModelRoute
from function_app.settings.storage import (
    BLOB_ACCOUNT,
    BLOB_CONTAINER,
    BLOB_ENDPOINT,
    BLOB_PREFIX,
    BLOB_SUFFIXES,
    BlobScope,
    SettingsError,
    account_endpoint,
    configured_endpoint,
)

if TYPE_CHECKING:
    from components.model_config import ModelConfig

MODELS = "RETRAIN_MODELS"
MODEL_NAME = "RETRAIN_MODEL_NAME"
ALL_MODELS = "*"


def served_models(values: Mapping[str, str], cwd: Path) -> tuple[ModelRoute, ...] | None:
    """The models RETRAIN_MODELS names, read from their files under `cwd`; None when it is unset."""
    from components.model_config import find_model_config, models_dir
    from components.specs import load_pipeline_spec

    text = values.get(MODELS)
    if text is None:
        return None
    for single in (MODEL_NAME, BLOB_PREFIX, BLOB_SUFFIXES):
        if single in values:
            instead = f"{MODELS} to name the models" if single == MODEL_NAME else "each file's [trigger]"
            raise SettingsError(
                f"{single} is set, but {MODELS} serves the models from their configuration files; expected "
                f"{single} unset ({instead})"
            )
    _check_default_endpoint(values)
    folder = models_dir(cwd, values)
    names = _names(text, folder)
    pipeline = load_pipeline_spec()  # read once: every file's [pipeline] is checked against it
    routes = []
    for name in names:
        try:
            config = find_model_config(name, cwd, values, pipeline)
        except PipelineError as error:  # ConfigError: names the file, the key and the expected form
            raise SettingsError(str(error)) from None
        if config is None:
            raise SettingsError(
                f"{MODELS} names {name!r}, but {folder / f'{name}.toml'} does not exist; expected a "
                f"configuration file for each model (`retrain init {name}` writes one)"
            )
        routes.append(
            ModelRoute(
                config.name,
                _scope(config, values, cwd),
                config.task.text,
                config.task.options,
                config.parameters(),
                config.path,
            )
        )
    return tuple(routes)


def _names(text: str, folder: Path) -> list[str]:
    if text == ALL_MODELS:
        names = sorted(path.stem for path in folder.glob("*.toml") if path.is_file())
        if not names:
            raise SettingsError(
                f"{MODELS}={ALL_MODELS}, but {folder} holds no *.toml; expected the models' configuration "
                "files there (`retrain init NAME` writes one; RETRAIN_MODELS_DIR moves the folder)"
            )
        return names
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if not is_model_name(name):
            raise SettingsError(
                f"{MODELS} {quoted(text, 80)}: {quoted(name, 40)} is not a model name; expected "
                f"{ALL_MODELS}, or names of 1-40 lowercase letters, digits or '-' separated by commas"
            )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if not names or repeated:
        problem = f"names {repeated[0]!r} twice" if repeated else "names no model"
        raise SettingsError(f"{MODELS} {quoted(text, 80)}: {problem}; expected each served model once")
    return names


def _check_default_endpoint(values: Mapping[str, str]) -> None:
    account, endpoint = values.get(BLOB_ACCOUNT), configured_endpoint(values)
    if account is not None and endpoint is not None and endpoint.account != account:
        raise SettingsError(
            f"{BLOB_ENDPOINT} {quoted(values[BLOB_ENDPOINT])}: is not the endpoint of account {account!r} "
            f"({BLOB_ACCOUNT}); expected https://{account}.blob.core.windows.net or "
            f"http://127.0.0.1:<port>/{account}"
        )


def _scope(config: ModelConfig, values: Mapping[str, str], cwd: Path) -> BlobScope | None:
    """A model's blob scope: its [trigger], with the RETRAIN_BLOB_* defaults (see the module's rules)."""
    trigger = config.trigger
    account = trigger.account or values.get(BLOB_ACCOUNT)
    container = trigger.container or values.get(BLOB_CONTAINER)
    if account is None and container is None:
        return None
    if account is None or container is None:
        key, setting = ("account", BLOB_ACCOUNT) if account is None else ("container", BLOB_CONTAINER)
        raise SettingsError(
            f"{config.path}: [trigger] {key} is unset, and so is {setting}; expected both the account and "
            "the container (or neither: the model then takes no blob events)"
        )
    try:
        # A module task is looked for where this interpreter imports from: the app root first.
        suffixes = config.trigger_suffixes([str(cwd), *sys.path])
    except PipelineError as error:  # one line naming the file, the task and why
        raise SettingsError(str(error)) from None
    return BlobScope(
        account_endpoint(account, values), container, trigger.prefix, suffixes, config.trigger_depth()
    )
