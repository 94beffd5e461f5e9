"""What a `retrain run` or `retrain submit` trains, before any data is pinned: the model, its task and
options, and the pipeline parameters, from the model's configuration file and the command line.

The file is `--config FILE`, else `models/<--model-name>.toml` when it exists (components/model_config.py).
The command line wins over the file: `--param` over its [pipeline] and [gate] values, `--task` over its
[task] (the file's options then apply only when the task is the same), and `--task-options JSON` then
`--task-option KEY=VALUE` over the options. A model without a file needs --task: a missing file is an
error naming where it was looked for (a typo in --model-name, or a RETRAIN_MODELS_DIR pointing elsewhere,
must not train the built-in tabular task on data it cannot read).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from components.errors import ConfigError, SubmissionError
from components.model_config import (
    DEFAULT_MODELS_DIR,
    MODELS_DIR_VARIABLE,
    ModelConfig,
    config_file,
    find_model_config,
    load_model_config,
)
from components.request import DataRef, RunRequest
from components.run_inputs import GATE_INPUTS
from components.specs import PipelineSpec, load_pipeline_spec
from components.task_ref import (
    DEFAULT_TASK,
    check_task_options,
    parse_task_reference,
    task_file_sha256,
)
from core.names import check_model_name
from core.task_ref import options_text

DEFAULT_MODEL_NAME = "digits"


@dataclass(frozen=True)
class RunSettings:
    """A run's model, task and parameters, checked; `request()` makes the run request once data is pinned."""

    model_name: str
    task: str = DEFAULT_TASK
    task_options: Mapping[str, Any] = field(default_factory=dict)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    config: ModelConfig | None = None
    task_sha256: str | None = None
    where: str = "the gate policy"  # how a preflight error names where the policy came from

    def __post_init__(self) -> None:
        check_model_name(self.model_name, "model name", SubmissionError)
        reference = parse_task_reference(self.task, None, "task")
        object.__setattr__(self, "task", reference.text)
        object.__setattr__(self, "task_options", MappingProxyType(check_task_options(self.task_options)))
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))
        if reference.path is not None and self.task_sha256 is None:
            object.__setattr__(self, "task_sha256", task_file_sha256(reference.path))

    @property
    def task_options_text(self) -> str:
        return options_text(self.task_options)

    def request(self, data: DataRef, **fields: Any) -> RunRequest:
        return RunRequest(
            model_name=self.model_name,
            data=data,
            parameters=self.parameters,
            task=self.task,
            task_options=self.task_options,
            task_sha256=self.task_sha256,
            **fields,
        )


def option_pairs(pairs: Sequence[str]) -> dict[str, Any]:
    """`--task-option KEY=VALUE` (repeatable): VALUE is JSON when it parses (numbers, lists, booleans),
    else plain text; the same reading as the training steps' (training/tasks/loader.py)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key.strip().isidentifier():
            raise SubmissionError(f"--task-option {pair!r}: expected KEY=VALUE, e.g. label_column=species")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


def options_object(text: str | None) -> dict[str, Any]:
    """`--task-options JSON`: one JSON object."""
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as error:
        raise SubmissionError(f"--task-options {text!r}: not JSON ({error}); expected an object") from None
    if not isinstance(options, dict):
        raise SubmissionError(
            f'--task-options {text!r}: expected a JSON object such as {{"hidden_width": 64}}'
        )
    return options


def _config(
    model_name: str | None,
    given_file: Path | None,
    cwd: Path,
    environ: Mapping[str, str],
    spec: PipelineSpec,
) -> ModelConfig | None:
    if given_file is not None:
        config = load_model_config(given_file if given_file.is_absolute() else cwd / given_file, spec)
        if model_name is not None and model_name != config.name:
            raise ConfigError(
                f"{config.path}: configures model {config.name!r}, but --model-name is {model_name!r}; "
                "expected one of them, or the same name"
            )
        return config
    return find_model_config(model_name or DEFAULT_MODEL_NAME, cwd, environ, spec)


def missing_config(name: str, cwd: Path, environ: Mapping[str, str]) -> ConfigError:
    """The one-line error for a model without a configuration file: where it was looked for, why there,
    and the three ways on."""
    folder = environ.get(MODELS_DIR_VARIABLE)
    why = (
        f"{MODELS_DIR_VARIABLE}={folder}"
        if folder
        else f"./{DEFAULT_MODELS_DIR} under the working folder; {MODELS_DIR_VARIABLE} moves it"
    )
    return ConfigError(
        f"model {name!r}: no configuration file {config_file(name, cwd, environ)} ({why}); expected one: "
        f"`retrain init {name} --task tabular|image|custom` writes it, or give --config FILE or --task REF"
    )


def resolve_run_settings(
    *,
    model_name: str | None,
    config_file: Path | None,
    task: str | None,
    task_options: str | None,
    task_option: Sequence[str],
    parameters: Mapping[str, Any],
    cwd: Path,
    environ: Mapping[str, str],
    pipeline: PipelineSpec,
) -> RunSettings:
    """The run's settings from the configuration file (if any) with the command line over it."""
    from components.parameters import check_parameter_texts, check_parameters

    config = _config(model_name, config_file, cwd, environ, pipeline)
    if config is None and task is None:
        raise missing_config(model_name or DEFAULT_MODEL_NAME, cwd, environ)
    chosen = config.task.text if config is not None else DEFAULT_TASK
    options: dict[str, Any] = dict(config.task.options) if config is not None else {}
    if task is not None:
        chosen = parse_task_reference(task, cwd).text
        if config is None or chosen != config.task.text:
            options = {}  # a file's options belong to the task it names
    options.update(options_object(task_options))
    options.update(option_pairs(task_option))
    merged = {**(config.parameters() if config is not None else {}), **parameters}
    check_parameters(pipeline, merged)
    # The command line's values are text: each must read as its input's type, within its bounds, before
    # any step runs (the file's were checked when it was read).
    check_parameter_texts(pipeline, {name: str(value) for name, value in parameters.items()})
    given = [f"--param {name}" for name in GATE_INPUTS if name in parameters]
    where = f"{config.path} [gate]" if config is not None else "the gate policy"
    return RunSettings(
        where=f"the gate policy ({', '.join(given)})" if given else where,
        model_name=config.name if config is not None else (model_name or DEFAULT_MODEL_NAME),
        task=chosen,
        task_options=options,
        parameters=merged,
        config=config,
    )


def add_task_options(parser: argparse.ArgumentParser) -> None:
    """--config, --task, --task-options and --task-option: what a run trains, over the model's file. Both
    `retrain run` and `retrain submit` take them."""
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"the model's configuration (default: NAME.toml in ${MODELS_DIR_VARIABLE}, "
        f"else ./{DEFAULT_MODELS_DIR})",
    )
    parser.add_argument(
        "--task",
        metavar="REF",
        help="tabular, image, file.py:Attr or package.module:Attr (default: the file's; needed without one)",
    )
    parser.add_argument("--task-options", metavar="JSON", help="the task's options as one JSON object")
    parser.add_argument(
        "--task-option", action="append", default=[], metavar="KEY=VALUE", help="one task option (repeatable)"
    )


def settings_from_arguments(args: argparse.Namespace, parameters: dict[str, object]) -> RunSettings:
    """The run's model, task and parameters: the configuration file, with the command line over it
    (`add_task_options`' flags, --model-name, `parameters` from --param)."""
    return resolve_run_settings(
        model_name=args.model_name,
        config_file=args.config,
        task=args.task,
        task_options=args.task_options,
        task_option=args.task_option,
        parameters=parameters,
        cwd=Path.cwd(),
        environ=args.environ,
        pipeline=load_pipeline_spec(),
    )
