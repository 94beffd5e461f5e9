"""Find a task by reference: a built-in name, `path/to/file.py:Attr` or `package.module:Attr`.

`Attr` may be a `Task` instance (then it takes no options), or a class or factory that the task's options
are passed to as keyword arguments. Whatever goes wrong (no such file, an import error inside the user's
module, a missing attribute, a part of the contract missing) is one `InputError` line that names the task
reference and what is missing, raised before any data is read or any process started.

A task file may import the modules of its own folder (`import helpers`, `from helpers import x`, packages in
sub-folders): the folder is put on sys.path, after every other entry, as Python puts a script's. They are
the task's code (core/sources.py file_task_sources finds them from the import statements), so a module of
the folder imported otherwise while the task file is imported (importlib, __import__), which no cache key or
check could see, is refused in one line.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.errors import InputError, RetrainError
from core.files import file_sha256
from core.sources import INSTALLED_FOLDERS, file_task_sources, task_sources_sha256
from core.task_ref import TASK_FORMS, TaskRef, parse_task_ref, with_task_secrets
from training.tasks.base import Task, missing_parts


def task_file_sha256(ref: TaskRef) -> str | None:
    """The content hash of a task file (what the local runner's cache key and lineage record)."""
    if ref.path is None or not ref.path.is_file():
        return None
    return file_sha256(ref.path)


def task_code_sha256(ref: TaskRef) -> str | None:
    """The hash of a user's task code, as the local runner's cache key holds it and lineage records it
    (core/sources.py task_sources_sha256): a task file's with the modules of its folder it imports, or a
    module task's package sources found on this process's sys.path (in a step, the code folder comes
    first, as where the runner looks). None for a built-in, whose code is the code snapshot's."""
    hashed = task_sources_sha256(ref, sys.path)
    return hashed.sha256 if hashed is not None else None


def _file_module_name(path: Path) -> str:
    return "retrain_user_task_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]


def user_task_modules(text: str, cwd: Path | None = None) -> list[str]:
    """The modules of the user's task `text` names that this process has imported (none for a built-in):
    what a process forked from this one must import afresh, as a fresh interpreter would."""
    ref = parse_task_ref(text, cwd or Path.cwd())
    if ref.path is not None:
        return [name for name in (_file_module_name(ref.path),) if name in sys.modules]
    if ref.is_builtin or ref.module is None:
        return []
    package = str(ref.module).split(".", 1)[0]
    return [name for name in sys.modules if name == package or name.startswith(f"{package}.")]


def _import_module(ref: TaskRef) -> Any:
    if ref.path is not None:
        if not ref.path.is_file():
            raise InputError(f"--task {ref.text!r}: no file {ref.path}; expected {TASK_FORMS}")
        name = _file_module_name(ref.path)
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, ref.path)
        if spec is None or spec.loader is None:
            raise InputError(f"--task {ref.text!r}: {ref.path} cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        folder = str(ref.path.parent)
        if folder not in sys.path:
            sys.path.append(folder)  # its own modules, as a script's; never in place of another's
        loaded = set(sys.modules)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[name]
            raise InputError(
                f"--task {ref.text!r}: importing {ref.path} failed: {_one_line(error)}"
            ) from error
        try:
            _check_found_statically(ref, set(sys.modules) - loaded)
        except InputError:
            del sys.modules[name]
            raise
        return module
    try:
        return importlib.import_module(str(ref.module))
    except ModuleNotFoundError as error:
        raise InputError(f"--task {ref.text!r}: no module {error.name!r}; expected {TASK_FORMS}") from error
    except Exception as error:
        raise InputError(f"--task {ref.text!r}: importing {ref.module} failed: {_one_line(error)}") from error


def _check_found_statically(ref: TaskRef, imported: set[str]) -> None:
    """Refuses a module of the task file's folder that importing the file loaded but that its import
    statements do not name (file_task_sources): importlib or __import__ found it, and its edits would
    neither rerun the steps nor fail a run."""
    assert ref.path is not None
    folder = ref.path.parent.resolve()
    known = {path.resolve() for path in file_task_sources(ref.path).values()}
    for name in sorted(imported):
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if not path.is_relative_to(folder) or path in known:
            continue
        if INSTALLED_FOLDERS.intersection(path.relative_to(folder).parts):
            continue  # an installed package, if the folder holds a virtual environment
        raise InputError(
            f"--task {ref.text!r}: importing it loaded {path.relative_to(folder).as_posix()} (module "
            f"{name!r}) from the task's folder, which no import statement names, so an edit to it would "
            f"not rerun the steps; import it with an import statement (`import {name}`) instead of "
            "importlib or __import__"
        )


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")[:300]


def _instantiate(ref: TaskRef, target: Any, options: Mapping[str, Any]) -> Any:
    if not (inspect.isclass(target) or inspect.isfunction(target)):
        if options:
            raise InputError(
                f"--task {ref.text!r}: {ref.attribute} is a task instance, which takes no options; "
                f"remove {sorted(options)} or point --task at its class"
            )
        return target
    factory: Callable[..., Any] = target
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
        unknown = sorted(set(options) - set(signature.parameters)) if not accepts_any else []
        if unknown:
            known = [name for name in signature.parameters if name != "self"]
            raise InputError(
                f"--task {ref.text!r}: unknown option(s) {unknown}; this task takes {known or 'none'}"
            )
    try:
        return factory(**options)
    except RetrainError as error:
        raise InputError(f"--task {ref.text!r}: {error}") from error
    except TypeError as error:
        raise InputError(f"--task {ref.text!r}: cannot build the task ({_one_line(error)})") from error


def load_task(
    text: str,
    options: Mapping[str, Any] | None = None,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Task:
    """The task `text` names, built with `options`, checked to have every part of the contract.

    A task secret written as `***` (a step's or worker's command line, a model.pt, a lineage tag: see
    core/task_ref.py) is given its value from `environ`'s RETRAIN_TASK_SECRETS, by default this process's:
    every process that builds a task does it here (a step, a torchrun worker, MLflow's serving process), so
    none can pass the placeholder to the task instead."""
    ref = parse_task_ref(text, cwd or Path.cwd())
    given = with_task_secrets(options or {}, os.environ if environ is None else environ)
    module = _import_module(ref)
    if not hasattr(module, ref.attribute):
        where = ref.path or ref.module
        raise InputError(f"--task {ref.text!r}: {where} has no attribute {ref.attribute!r}")
    task = _instantiate(ref, getattr(module, ref.attribute), given)
    missing = missing_parts(task)
    if missing:
        raise InputError(
            f"--task {ref.text!r}: not a complete task, it lacks {', '.join(missing)} "
            "(see training/tasks/base.py)"
        )
    return task


def parse_task_options(pairs: list[str] | None) -> dict[str, Any]:
    """`--task-option KEY=VALUE` (repeatable) -> options; VALUE is JSON when it parses (numbers, lists,
    booleans), else a plain string."""
    options: dict[str, Any] = {}
    for pair in pairs or []:
        key, separator, value = pair.partition("=")
        if not separator or not key.strip().isidentifier():
            raise InputError(f"--task-option {pair!r}: expected KEY=VALUE, e.g. label_column=species")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


def options_from_json(text: str | None, what: str = "--task-options") -> dict[str, Any]:
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as error:
        raise InputError(
            f'{what} {text!r}: not JSON ({error}); expected an object such as {{"hidden_width": 128}}'
        ) from None
    if not isinstance(options, dict):
        raise InputError(f'{what} {text!r}: expected a JSON object such as {{"hidden_width": 128}}')
    return options
