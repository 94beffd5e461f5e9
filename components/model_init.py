"""`retrain init NAME --task tabular|image|custom`: a commented configuration file, and for `custom` a task
file that runs as it is on generated sample data.

    models/NAME.toml        every key of components/model_config.py, explained in comments
    models/NAME_task.py     (custom) a complete task: prepare, load, model, loss, metrics, serving, drift,
                            and `python models/NAME_task.py --sample RAW` to generate data it trains on

Nothing is overwritten: if either file exists, nothing is written. The templates are in
components/templates/ (text, not modules: components/ never imports torch, the task file does).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from string import Template

from components.errors import ConfigError, SubmissionError
from components.model_config import CONFIG_SUFFIX
from core.names import check_model_name

TEMPLATES = Path(__file__).resolve().parent / "templates"
KINDS = ("tabular", "image", "custom")
TASK_FILE_SUFFIX = "_task.py"


@dataclass(frozen=True)
class InitResult:
    config: Path
    task_file: Path | None = None


def class_name(model_name: str) -> str:
    """`house-prices` -> `HousePricesTask`: the custom task's class."""
    return "".join(part.capitalize() for part in re.split(r"[-_]", model_name) if part) + "Task"


def _template(name: str) -> Template:
    return Template((TEMPLATES / name).read_text())


def render_config(model_name: str, kind: str, task_file: str | None = None) -> str:
    values = {
        "name": model_name,
        "kind": kind,
        "ref": f"{task_file}:{class_name(model_name)}" if kind == "custom" else kind,
        "task_file": task_file or "",
        "class_name": class_name(model_name),
        "suffixes_line": {
            "tabular": '# suffixes = [".csv", ".parquet"]  # default: the task\'s raw file suffixes',
            "image": '# suffixes = [".png", ".jpg", ".jpeg"]  # default: the task\'s raw file suffixes',
            "custom": f'# suffixes = [".csv"]            # default: {class_name(model_name)}.raw_suffixes',
        }[kind],
    }
    head, body, tail = (
        _template(part).substitute(values).rstrip("\n") + "\n"
        for part in ("head.toml.tmpl", f"{kind}.toml.tmpl", "common_tail.toml.tmpl")
    )
    return f"{head}{body}\n{tail}"


def render_task_file(model_name: str, task_path: str) -> str:
    return _template("custom_task.py.tmpl").substitute(
        name=model_name, class_name=class_name(model_name), task_path=task_path
    )


def _write_new(path: Path, text: str) -> None:
    """Create `path` with `text`; never replace a file (O_EXCL), and leave nothing half-written."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise ConfigError(
            f"{path}: exists already; expected a new model name, or remove the file first"
        ) from None
    except OSError as error:
        raise ConfigError(
            f"{path}: cannot be written ({error.strerror or error}); expected a writable folder"
        ) from None
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def init_model(model_name: str, kind: str, folder: Path, shown_folder: str | None = None) -> InitResult:
    """Write the configuration (and for `custom` the task file) of `model_name` into `folder`.
    `shown_folder` is how the task file's docstring names the folder (default: `folder` as given)."""
    check_model_name(model_name, "model name", SubmissionError)
    if kind not in KINDS:
        raise ConfigError(f"--task {kind!r}: expected one of {', '.join(KINDS)}")
    config = folder / f"{model_name}{CONFIG_SUFFIX}"
    task_file = folder / f"{model_name}{TASK_FILE_SUFFIX}" if kind == "custom" else None
    existing = [str(path) for path in (config, task_file) if path is not None and path.exists()]
    if existing:
        raise ConfigError(
            f"{existing[0]}: exists already; expected a new model name, or remove the file first"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a parent that is a file, read-only, or not there to create (/proc/x)
        raise ConfigError(
            f"--dir {folder}: cannot be created ({error.strerror or error}); expected a folder that exists "
            "or can be made"
        ) from None
    if task_file is None:
        _write_new(config, render_config(model_name, kind))
        return InitResult(config)
    shown = f"{shown_folder or folder}/{task_file.name}"
    _write_new(task_file, render_task_file(model_name, shown))
    try:
        _write_new(config, render_config(model_name, kind, task_file.name))
    except BaseException:
        task_file.unlink(missing_ok=True)
        raise
    return InitResult(config, task_file)
