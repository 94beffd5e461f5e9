"""`retrain init NAME --task tabular|image|custom`: a commented configuration file, for `custom` a task
file that runs as it is on generated sample data, and for `tabular` a sample table to train on.

    models/NAME.toml        every key of components/model_config.py, explained in comments: the ones a
                            kind sets, and the others commented out with their defaults
    models/NAME_task.py     (custom) a complete task: prepare, load, model, loss, metrics, serving, drift,
                            and `python models/NAME_task.py --sample RAW` to generate data it trains on
    landing/NAME/batch-0001.csv
                            (tabular, where the caller names a sample folder: `retrain init` does) the
                            table the configuration describes, numeric, categorical and boolean columns
                            with blanks and a label of names (components/local/sample_table.py)

The configuration is rendered from components/local/templates/ (text, not modules: components/ never imports
torch, the task file does): head.toml.tmpl, the kind's [task.options] (KIND.toml.tmpl), then what every
kind shares, gate.toml.tmpl with the kind's metrics and bounds (GATES below) and common_tail.toml.tmpl
([pipeline] and [trigger]). Nothing is overwritten: if any file exists, nothing is written.
"""

from __future__ import annotations

import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from string import Template

from components.errors import ConfigError, SubmissionError
from components.local.sample_table import write_sample_table
from components.model_config import CONFIG_SUFFIX
from core.names import check_model_name

TEMPLATES = Path(__file__).resolve().parent / "templates"
KINDS = ("tabular", "image", "custom")
TASK_FILE_SUFFIX = "_task.py"
# Where `retrain init NAME --task tabular` writes its sample table, under the folder it runs in: landing/NAME,
# as a local landing container holds the model's files (its [trigger] prefix is NAME).
LANDING_FOLDER = "landing"
COMMENT_COLUMN = 35  # where a key's trailing comment starts, when the key and its value leave room
LINE_WIDTH = 110


@dataclass(frozen=True)
class InitResult:
    config: Path
    task_file: Path | None = None
    sample: Path | None = None  # tabular: the sample table written


@dataclass(frozen=True)
class GateExample:
    """A kind's [gate] values as TOML text, for gate.toml.tmpl; the bounds named in `commented` are shown
    commented out, as examples."""

    metrics: str  # which metrics the task reports, and their directions
    primary_metric: str
    min_improvement: str
    floors: str
    max_regression: str
    first_model_floors: str
    commented: tuple[str, ...] = ()  # the bounds shown commented out: the data decides what they should be


_CLASSIFIER_METRICS = (
    'Metrics: accuracy, macro_f1, recall_<class> (higher is better; "recall_*" names each class), loss '
    "(lower is better)."
)
GATES = {
    "tabular": GateExample(
        metrics=f'{_CLASSIFIER_METRICS} With objective = "regression": rmse (the default primary metric), '
        "mae, loss (lower is better) and r2 (higher is better); set the bounds below in those.",
        primary_metric="macro_f1",
        min_improvement="0.002",
        floors="{ accuracy = 0.75 }",
        max_regression='{ accuracy = 0.02, "recall_*" = 0.1 }',
        first_model_floors="{ accuracy = 0.8, macro_f1 = 0.75 }",
    ),
    "image": GateExample(
        metrics=_CLASSIFIER_METRICS,
        primary_metric="macro_f1",
        min_improvement="0.002",
        floors="{ accuracy = 0.5 }",
        max_regression='{ accuracy = 0.02, "recall_*" = 0.15 }',
        first_model_floors="{ accuracy = 0.6 }",
    ),
    "custom": GateExample(
        metrics="The metrics are those $class_name declares: mse and mae, lower is better.",
        primary_metric="mse",
        min_improvement="0.0",
        floors="{ mse = 1.0 }",
        max_regression="{ mae = 0.05 }",
        first_model_floors="{ mse = 2.0 }",
        commented=("floors", "max_regression", "first_model_floors"),
    ),
}
_BOUNDS = ("floors", "max_regression", "first_model_floors")
# `key = value  # why` (or `# key = value  # why`): the comment is aligned at COMMENT_COLUMN.
_KEY_LINE = re.compile(r"(?P<code>(?:# )?[A-Za-z_][A-Za-z0-9_]* = .*?\S)\s{2,}(?P<comment># .*)")


def class_name(model_name: str) -> str:
    """`house-prices` -> `HousePricesTask`: the custom task's class."""
    return "".join(part.capitalize() for part in re.split(r"[-_]", model_name) if part) + "Task"


def _template(name: str) -> Template:
    return Template((TEMPLATES / name).read_text())


def _aligned(line: str) -> str:
    match = _KEY_LINE.fullmatch(line)
    if match is None:
        return line
    code = match["code"]
    return code + " " * max(COMMENT_COLUMN - len(code), 2) + match["comment"]


def _comment_lines(text: str) -> str:
    return "\n".join(textwrap.wrap(text, LINE_WIDTH, initial_indent="# ", subsequent_indent="# "))


def _gate_values(kind: str, model_name: str) -> dict[str, str]:
    gate = GATES[kind]
    values = {
        "metrics": _comment_lines(Template(gate.metrics).substitute(class_name=class_name(model_name))),
        "primary_metric": gate.primary_metric,
        "min_improvement": gate.min_improvement,
    }
    for bound in _BOUNDS:
        values[bound] = getattr(gate, bound)
        values[f"{bound}_mark"] = "# " if bound in gate.commented else ""
    return values


def render_config(model_name: str, kind: str, task_file: str | None = None) -> str:
    """The configuration `retrain init` writes: every kind's from the same shared parts (see above)."""
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
        **_gate_values(kind, model_name),
    }
    head, body, gate, tail = (
        _template(part).substitute(values).rstrip("\n") + "\n"
        for part in ("head.toml.tmpl", f"{kind}.toml.tmpl", "gate.toml.tmpl", "common_tail.toml.tmpl")
    )
    return "\n".join(_aligned(line) for line in f"{head}{body}\n{gate}\n{tail}".splitlines()) + "\n"


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


def init_model(
    model_name: str,
    kind: str,
    folder: Path,
    shown_folder: str | None = None,
    sample_folder: Path | None = None,
) -> InitResult:
    """Write the configuration (and for `custom` the task file) of `model_name` into `folder`, and for
    `tabular` with a `sample_folder` the sample table into it (`retrain init` names `landing/NAME`).
    `shown_folder` is how the task file's docstring names the folder (default: `folder` as given)."""
    check_model_name(model_name, "model name", SubmissionError)
    if kind not in KINDS:
        raise ConfigError(f"--task {kind!r}: expected one of {', '.join(KINDS)}")
    config = folder / f"{model_name}{CONFIG_SUFFIX}"
    task_file = folder / f"{model_name}{TASK_FILE_SUFFIX}" if kind == "custom" else None
    sample = sample_folder if kind == "tabular" else None
    existing = [str(path) for path in (config, task_file) if path is not None and path.exists()]
    if existing:
        raise ConfigError(
            f"{existing[0]}: exists already; expected a new model name, or remove the file first"
        )
    if sample is not None and sample.exists() and (not sample.is_dir() or any(sample.iterdir())):
        # The sample would join (or meet) data already there, and a run would train on both.
        raise ConfigError(
            f"{sample}: exists already and is not an empty folder; expected a new folder for the sample "
            "data (a new model name, or move it first)"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a parent that is a file, read-only, or not there to create (/proc/x)
        raise ConfigError(
            f"--dir {folder}: cannot be created ({error.strerror or error}); expected a folder that exists "
            "or can be made"
        ) from None
    written: list[Path] = []
    made_sample_folder = sample is not None and not sample.exists()
    try:
        if task_file is not None:
            shown = f"{shown_folder or folder}/{task_file.name}"
            _write_new(task_file, render_task_file(model_name, shown))
            written.append(task_file)
        sample_file = write_sample_table(sample) if sample is not None else None
        if sample_file is not None:
            written.append(sample_file)
        _write_new(config, render_config(model_name, kind, task_file.name if task_file else None))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        if made_sample_folder and sample is not None and sample.is_dir() and not any(sample.iterdir()):
            sample.rmdir()
        raise
    return InitResult(config, task_file, sample_file)
