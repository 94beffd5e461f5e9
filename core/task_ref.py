"""Task references and task options as text: the one parser of a `--task` value and the one canonical
JSON text of a task's options, which the pipeline (components/task_ref.py), the trainer's command line
and the task loader (training/tasks/loader.py) all use. Torch-free, standard library only: parsing
imports nothing.

A reference is a built-in name (`tabular`, `image`), a task file `path/to/file.py:Attr` or a module
`package.module:Attr`; `Attr` is a `Task` instance, or a class or factory the options are passed to.

A task option whose name is a credential's (core.secrets.is_secret_name: `api_token`, `client_secret`,
`storage_key`...) is a *task secret*: the task gets its value, and nothing written holds it. Every written
form of the options (command lines, pipeline inputs, cache and checkpoint keys, checkpoints, model.pt,
metadata, gate files, lineage tags, the registered model) has `***` in its place, so a secret's value
decides no key: a rotated token resumes the same training and reuses the same steps. The value travels to
the processes that build the task in the environment, `RETRAIN_TASK_SECRETS` (a JSON object, readable by
its user alone, unlike a command line), which whoever starts such a process sets from the options it was
given; the loader puts it back in place of each `***`. A user can give `***` as the value too, the real one
in that variable: a secret then stands in no configuration file or command line at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InputError, RetrainError
from core.secrets import MASK, is_secret_name

# Where each built-in task lives, as text (the loader imports it; nothing here does).
BUILTIN_TASKS: dict[str, str] = {
    "tabular": "training.tasks.tabular.task:TabularTask",
    "image": "training.tasks.image.task:ImageTask",
}
TASK_FORMS = "a built-in (tabular, image), path/to/file.py:Attr or package.module:Attr"


@dataclass(frozen=True)
class TaskRef:
    """A parsed task reference. `text` is the reference as given (stripped); `path` (absolute) is set for a
    task file, `module` for a module or a built-in (whose module is the training code's)."""

    text: str
    module: str | None
    path: Path | None
    attribute: str

    @property
    def is_builtin(self) -> bool:
        return self.text in BUILTIN_TASKS

    @property
    def is_file(self) -> bool:
        return self.path is not None


def parse_task_ref(
    text: str,
    base: Path | None = None,
    what: str = "--task",
    error: Callable[[str], RetrainError] = InputError,
) -> TaskRef:
    """`text` checked for form only (nothing is imported, a task file need not exist yet). A relative task
    file is resolved against `base` (the working folder, or the folder of the configuration file that
    names it); without a base it must be absolute. A bad reference is `error` (the caller's room's type),
    one line naming `what` was read and the expected forms."""
    text = text.strip() if isinstance(text, str) else ""
    if text in BUILTIN_TASKS:
        module, _, attribute = BUILTIN_TASKS[text].partition(":")
        return TaskRef(text, module, None, attribute)
    location, colon, attribute = text.rpartition(":")
    if not colon or not location or not attribute.isidentifier():
        raise error(f"{what} {text!r}: expected {TASK_FORMS}")
    if location.endswith(".py"):
        path = Path(location).expanduser()
        if not path.is_absolute():
            if base is None:
                raise error(f"{what} {text!r}: expected the task file as an absolute path")
            path = Path(base) / path
        return TaskRef(text, None, path.resolve(), attribute)
    if not all(part.isidentifier() for part in location.split(".")):
        raise error(
            f"{what} {text!r}: {location!r} is neither a .py file nor a module name; expected {TASK_FORMS}"
        )
    return TaskRef(text, location, None, attribute)


def options_text(options: Mapping[str, Any]) -> str:
    """A task's options as one canonical JSON text, as they are written (each secret's value `***`):
    compact, sorted keys, ASCII only, and with every single quote written as the JSON escape \\u0027, so
    that the text can stand between the single quotes of a command line (a component's command on Azure
    ML, a local step's, the trainer's) and parses back to exactly the same object. The pipeline input, the
    trainer's --task-options and the lineage tag all carry this text."""
    text = json.dumps(written_options(options), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text.replace("'", "\\u0027")


TASK_SECRETS_VARIABLE = "RETRAIN_TASK_SECRETS"


def written_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options as anything may write them: each task secret's value replaced by `***`."""
    return {name: MASK if is_secret_name(name) else value for name, value in options.items()}


def secret_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The task secrets among `options` that hold a value (not the `***` that stands for one)."""
    return {name: value for name, value in options.items() if is_secret_name(name) and value != MASK}


def task_secrets(environ: Mapping[str, str]) -> dict[str, Any]:
    """The task secrets `environ` carries (RETRAIN_TASK_SECRETS), or a one-line refusal that shows none."""
    text = environ.get(TASK_SECRETS_VARIABLE)
    if not text:
        return {}
    try:
        secrets = json.loads(text)
    except ValueError:
        secrets = None
    if not isinstance(secrets, dict) or not all(is_secret_name(name) for name in secrets):
        raise InputError(
            f"${TASK_SECRETS_VARIABLE} is not a JSON object of task secrets (its text is not shown); "
            'expected e.g. {"api_token": "..."}, each name a credential\'s (ending in token, secret, '
            "password, key...)"
        )
    return secrets


def task_secrets_environment(options: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """The environment that carries the task secrets of `options` to a process the caller starts, over
    those `environ` carries already; empty when `options` hold none."""
    secrets = secret_options(options)
    if not secrets:
        return {}
    return {TASK_SECRETS_VARIABLE: json.dumps({**task_secrets(environ), **secrets}, sort_keys=True)}


def with_task_secrets(options: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """`options` with each task secret written as `***` given its value from `environ`; a secret whose
    value is not there is refused in one line."""
    masked = [name for name, value in options.items() if is_secret_name(name) and value == MASK]
    if not masked:
        return dict(options)
    secrets = task_secrets(environ)
    missing = [name for name in masked if name not in secrets]
    if missing:
        raise InputError(
            f"task option(s) {missing} are secrets, whose values are never written down; give them in "
            f'${TASK_SECRETS_VARIABLE}, a JSON object such as {{{json.dumps(missing[0])}: "..."}}'
        )
    return {**options, **{name: secrets[name] for name in masked}}
