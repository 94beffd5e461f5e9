"""The pipeline inputs a run sets itself, never a `--param`: identical values locally and on Azure ML.

The local runner and the Azure ML builder both fill these from the run request, so a registered model's
lineage (trigger, raw data version, environment version) reads the same wherever it was trained.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from components.errors import SpecError
from components.specs import ENVIRONMENT_FILE, load_yaml

DATA_INPUT = "raw_data"
MODEL_NAME_INPUT = "model_name"
TRIGGER_INPUT = "trigger"
DATA_VERSION_INPUT = "raw_data_version"
ENVIRONMENT_VERSION_INPUT = "environment_version"
TASK_INPUT = "task"
TASK_OPTIONS_INPUT = "task_options"
# The prepare step's own input that the run sets on it (RunRequest.previous_prepared), as Azure ML pipeline
# YAML has no optional pipeline inputs: the model's last good prepared data version.
PREVIOUS_PREPARED_INPUT = "previous_prepared"
RESERVED_INPUTS = (
    DATA_INPUT,
    MODEL_NAME_INPUT,
    TRIGGER_INPUT,
    DATA_VERSION_INPUT,
    ENVIRONMENT_VERSION_INPUT,
    TASK_INPUT,
    TASK_OPTIONS_INPUT,
    PREVIOUS_PREPARED_INPUT,
)
# The register step's gate policy inputs: a model's configuration file sets them ([gate]); unset, the
# register step takes the task's defaults.
GATE_INPUTS = (
    "primary_metric",
    "min_improvement",
    "floors",
    "max_regression",
    "first_model_floors",
    "bootstrap_unloadable_champion",
    "confidence",
)
# A scheduled run resolves `<asset>@latest` when it fires; its version is known only inside the job.
UNPINNED_DATA_VERSION = "latest"

_UNSAFE_IN_ARGUMENT = re.compile(r"[^A-Za-z0-9_.,:/@=+-]")


def trigger_argument(trigger: Mapping[str, str]) -> str:
    """The register step's `--trigger` value: 'manual', or the sorted `key=value` pairs, made safe to pass
    on a command line (the full metadata travels unchanged in the job tags)."""
    if not trigger:
        return "manual"
    pairs = ",".join(f"{key}={value}" for key, value in sorted(trigger.items()))
    return _UNSAFE_IN_ARGUMENT.sub("_", pairs)


def environment_version(environment_file: Path = ENVIRONMENT_FILE) -> str:
    """The version components name for their environment, as environment.yml declares it."""
    version = load_yaml(environment_file).get("version")
    if version is None:
        raise SpecError(f"{environment_file}: no 'version'; the environment must be versioned")
    return str(version)


def reserved_values(
    model_name: str,
    data_version: str,
    trigger: Mapping[str, str],
    task: str,
    task_options: str,
    environment_file: Path = ENVIRONMENT_FILE,
) -> dict[str, str]:
    """Every reserved input but the data itself, whose form differs (a folder locally, an asset on Azure).
    `task` is the reference as the steps see it (a task file's place in the code snapshot on Azure ML),
    `task_options` the JSON text of core.task_ref.options_text."""
    return {
        MODEL_NAME_INPUT: model_name,
        TRIGGER_INPUT: trigger_argument(trigger),
        DATA_VERSION_INPUT: data_version,
        ENVIRONMENT_VERSION_INPUT: environment_version(environment_file),
        TASK_INPUT: task,
        TASK_OPTIONS_INPUT: task_options,
    }
