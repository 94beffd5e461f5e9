"""Task references and task options as text: the one parser of a `--task` value and the one canonical
JSON text of a task's options, which the pipeline (components/task_ref.py), the trainer's command line
and the task loader (training/tasks/loader.py) all use. Torch-free, standard library only: parsing
imports nothing.

A reference is a built-in name (`tabular`, `image`), a task file `path/to/file.py:Attr` or a module
`package.module:Attr`; `Attr` is a `Task` instance, or a class or factory the options are passed to.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InputError, RetrainError

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
    """A task's options as one canonical JSON text: compact, sorted keys, ASCII only, and with every single
    quote written as the JSON escape \\u0027, so that the text can stand between the single quotes of a
    command line (a component's command on Azure ML, a local step's, the trainer's) and parses back to
    exactly the same object. The pipeline input, the trainer's --task-options and the lineage tag all
    carry this text."""
    text = json.dumps(dict(options), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text.replace("'", "\\u0027")
