"""A run's task as the pipeline carries it: its reference, its options checked as JSON values, and, for a
task file, where the file is and what its content hashes to. Torch-free, standard library only.

The reference forms, their parser and the options' canonical text are core/task_ref.py's; this module adds
the pipeline's rules, so that a typo is refused before anything is pinned or submitted. Whether the task
really loads, and has every part, is the preflight's question (components/preflight.py), which runs in the
training environment.

A task file travels with the code: locally the steps read it where it is (its code's hash joins each step's
cache key), and on Azure ML the builder copies it into the job's code snapshot, under `user_tasks/`, and
rewrites the reference to that relative path (components/azureml/code_snapshot.py). A task's code is what
core/sources.py task_sources finds: a task file and the modules of its folder it imports, or a module
task's package; it is hashed there, once, for every key and check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

from components.errors import SubmissionError
from core.task_ref import TASK_FORMS, TaskRef, parse_task_ref

DEFAULT_TASK = "tabular"
# The built-in tasks, and the raw files each reads: what a model's trigger scope accepts by default.
BUILTIN_RAW_SUFFIXES: dict[str, tuple[str, ...]] = {
    "tabular": (".csv", ".parquet"),
    "image": (".png", ".jpg", ".jpeg"),
}
# How deep a task's raw files lie in the data folder or blob prefix: 1, directly in it (tabular batches);
# 2, also in one level of sub-folders (the image task's class folders, and the default for a user's task).
RAW_DEPTHS: dict[str, int] = {"tabular": 1, "image": 2}
DEFAULT_RAW_DEPTH = 2
USER_TASKS_FOLDER = "user_tasks"


def parse_task_reference(text: str, base: Path | None, what: str = "--task") -> TaskRef:
    """core/task_ref.py's parse, with the pipeline's own rules: no single quote (the reference stands
    between single quotes in a step's command), a task file that exists now (a typo is refused before
    anything is pinned), and its text made absolute (`/abs/file.py:Attr`, what the steps are given)."""
    reference = parse_task_ref(text, base, what, SubmissionError)
    if "'" in reference.text:
        raise SubmissionError(
            f"{what} {reference.text!r}: a task reference cannot contain a single quote (')"
        )
    if reference.path is None:
        return reference
    if not reference.path.is_file():
        raise SubmissionError(f"{what} {reference.text!r}: no file {reference.path}; expected {TASK_FORMS}")
    return replace(reference, text=f"{reference.path}:{reference.attribute}")


def snapshot_text(reference: TaskRef) -> str:
    """The reference inside a code snapshot: the file under `user_tasks/`, relative to the code root (the
    steps' working folder); other references are unchanged."""
    if reference.path is None:
        return reference.text
    return f"{PurePosixPath(USER_TASKS_FOLDER, reference.path.name)}:{reference.attribute}"


def task_file_sha256(path: Path) -> str:
    """The hash of a task file's code, the file and the modules of its folder it imports
    (core/sources.py task_sources_sha256): what a request pins, the local step cache keys on and lineage
    records. A file alone hashes as its own sha256."""
    code = task_code(parse_task_ref(f"{Path(path).resolve()}:task"), ())
    return code.sha256 if code is not None else ""


@dataclass(frozen=True)
class TaskCode:
    """The source files a user's task runs from, each by its path with its sha256, and their one hash
    (core/sources.py task_sources_sha256: the request's task_sha256)."""

    files: Mapping[str, str]
    sha256: str
    what: str  # how a message names the code: "task file /abs/file.py", "task module X"
    main: str | None = None  # the task file's own path, which a message names as the code itself

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))

    def change(self, now: TaskCode | None) -> str | None:
        """One line naming the first file that differs in `now` and both hash prefixes; None if the same."""
        if now is not None and now.sha256 == self.sha256:
            return None
        found = dict(now.files) if now is not None else {}
        for path in sorted(set(self.files) | set(found)):
            if self.files.get(path) != found.get(path):
                was, became = (_prefix(files.get(path)) for files in (self.files, found))
                where = self.what if path == self.main else f"{self.what}: {path}"
                return f"{where}: changed during the run (sha256 {was} when the run started, {became} now)"
        return f"{self.what}: changed during the run"


def _prefix(digest: str | None) -> str:
    return f"{digest[:12]}..." if digest else "absent"


def task_code(reference: TaskRef, search_path: Sequence[str]) -> TaskCode | None:
    """What a user's task runs from, hashed now; None for a built-in (part of the code snapshot) or a
    module that `search_path` (the steps' sys.path) does not have, which the preflight then refuses. A task
    file that is gone is code with no files and an empty hash."""
    from core.sources import task_sources_sha256

    if reference.path is not None:
        what, main = f"task file {reference.path}", str(reference.path)
    elif reference.module is not None and not reference.is_builtin:
        what, main = f"task module {reference.module}", None
    else:
        return None
    hashed = task_sources_sha256(reference, search_path)
    if hashed is None:
        return TaskCode({}, "", what, main) if reference.path is not None else None
    files = {str(hashed.files[name]): digest for name, digest in hashed.hashes.items()}
    return TaskCode(files, hashed.sha256, what, main)


def _check_json_ready(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise SubmissionError(f"{where}: {value!r} is not a finite number; expected a JSON value")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SubmissionError(f"{where}: key {key!r} is not text; expected a JSON object")
            _check_json_ready(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json_ready(item, f"{where}[{index}]")
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise SubmissionError(
            f"{where}: {type(value).__name__} is not a JSON value; expected text, numbers, booleans, "
            "lists or tables"
        )


def check_task_options(options: Mapping[str, Any], what: str = "task options") -> dict[str, Any]:
    """Options as a plain dict of JSON values (what the steps' --task-options parses back)."""
    if not isinstance(options, Mapping):
        raise SubmissionError(f"{what}: expected a table of option names and values")
    _check_json_ready(options, what)
    bad = sorted(name for name in options if not name.isidentifier())
    if bad:
        raise SubmissionError(f"{what} {bad}: expected option names that are Python identifiers")
    return json.loads(json.dumps(dict(options)))  # plain lists and dicts, whatever came in


def raw_depth(task: str) -> int:
    """How many folder levels of a data folder hold the raw files of `task` (see RAW_DEPTHS)."""
    return RAW_DEPTHS.get(task, DEFAULT_RAW_DEPTH)
