"""A user's task's source files, found without importing them, and their one hash: what a cache key, the
"changed during the run" check, a kept preflight verdict and lineage record of a task's code.

A module task's code is its top-level package (module_sources). A task file's is the file and every module
of its own folder it imports, directly or through those modules (file_task_sources): the loader puts that
folder on sys.path, so `import helpers`, `from helpers import x` and packages in sub-folders reach it. Both
are found by reading import statements, never by running them; what only running finds (importlib,
__import__) the loader refuses when it sees it (training/tasks/loader.py).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.util
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from core.files import file_sha256
from core.task_ref import TaskRef

# Folders whose modules are installed ones, not the user's code, even inside the task's or steps' folder
# (a virtual environment there).
INSTALLED_FOLDERS = frozenset({"site-packages", "dist-packages"})


def module_sources(module: str, search_path: Sequence[str]) -> dict[str, Path]:
    """The source files a `package.module:Attr` task runs from, found without importing anything, each by
    its name relative to the folder holding its top-level package; {} when `search_path` has no `module`.

    A module's code is its whole top-level package's `.py` files: importing `pkg.mod` runs `pkg/__init__`,
    and a module imports its siblings. A top-level module alone is its file. Code it imports from other
    packages is the environment's. `search_path` is the steps' sys.path: importlib.machinery.PathFinder
    walks it without executing any `__init__` (importlib.util.find_spec would import the parents of a
    dotted name); a top-level name only the interpreter's own finders know (an editable install's) is
    asked of find_spec, which imports nothing for a top-level name.
    """
    top = module.partition(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [entry for entry in search_path if entry])
    if spec is None:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return {}
    if spec is None:
        return {}
    if spec.submodule_search_locations:  # a package; a namespace package may span several folders
        files: dict[str, Path] = {}
        for location in spec.submodule_search_locations:
            for folder, dirnames, filenames in os.walk(location):
                # Only folders that can be subpackages: not __pycache__, .git or a data folder's "my-files".
                dirnames[:] = sorted(
                    name for name in dirnames if name.isidentifier() and name != "__pycache__"
                )
                relative = PurePosixPath(top, Path(folder).relative_to(location).as_posix())
                for name in sorted(filenames):
                    if name.endswith(".py"):
                        files.setdefault((relative / name).as_posix(), Path(folder, name))
        return files
    origin = Path(spec.origin) if spec.origin else None
    return {origin.name: origin} if origin is not None and origin.is_file() else {}


def file_task_sources(path: Path) -> dict[str, Path]:
    """The source files a `path/to/file.py:Attr` task runs from, each by its name relative to the file's
    folder: the file, and each module of that folder it imports, then each module those import, found
    without importing anything.

    An import names a module of the folder when the folder has it as Python would find it there: a
    package (`name/__init__.py`, which importing any of its modules runs too), else a module file
    (`name.py`, or a compiled one), else a namespace folder to look into. `from package import name` also
    takes `name` as a module when the package has one; a relative import resolves within the importing
    module's package. Imports of anything else (the standard library, installed packages, Retrain itself)
    are the environment's. An import inside a function or under a condition counts: it may run. A file
    that does not parse is still part of the code; its own imports are then unknown, and its import fails
    anyway. Nothing but the imported names is looked at, so a task in a large folder costs what it imports.
    """
    folder = Path(path).parent
    found: dict[str, Path] = {Path(path).name: Path(path)}
    pending: list[tuple[Path, tuple[str, ...]]] = [(Path(path), ())]  # a file and its package's parts
    while pending:
        source, package = pending.pop()
        for dotted in _imported_names(source, package):
            for name, module, its_package in _folder_modules(folder, dotted):
                if name not in found:
                    found[name] = module
                    if module.suffix == ".py":
                        pending.append((module, its_package))
    return found


def _imported_names(source: Path, package: tuple[str, ...]) -> Iterator[str]:
    """Every absolute module name `source`'s import statements may import, `package` being its package's
    parts (none for a top-level module, whose relative imports fail when they run)."""
    try:
        tree = ast.parse(source.read_bytes(), str(source))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level > len(package):  # beyond the top-level package: fails when it runs
                    continue
                parts = list(package[: len(package) - (node.level - 1)])
            else:
                parts = []
            parts += node.module.split(".") if node.module else []
            if not parts:
                continue
            base = ".".join(parts)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def _folder_modules(folder: Path, dotted: str) -> Iterator[tuple[str, Path, tuple[str, ...]]]:
    """The files of `folder` that importing `dotted` runs, in order: each package's `__init__` and the
    module itself, each by its relative name, with the parts of the package it belongs to."""
    where, parts = folder, dotted.split(".")
    for index, part in enumerate(parts):
        if not part.isidentifier():
            return
        named = tuple(parts[: index + 1])
        init = _module_file(where / part, "__init__")
        if init is not None:
            yield PurePosixPath(*named, init.name).as_posix(), init, named
            where = where / part
            continue
        module = _module_file(where, part)
        if module is not None:
            yield PurePosixPath(*named[:-1], module.name).as_posix(), module, named[:-1]
            return
        if not (where / part).is_dir():
            return
        where = where / part  # a namespace package: its modules are files of their own


def _module_file(folder: Path, name: str) -> Path | None:
    """The file Python imports module `name` from in `folder`, in its finder's order: compiled, then
    source, then bytecode alone."""
    for suffix in importlib.machinery.all_suffixes():
        candidate = folder / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def task_sources(reference: TaskRef, search_path: Sequence[str]) -> dict[str, Path]:
    """A user's task's source files by name: a task file's (file_task_sources) or a module task's
    (module_sources, looked for on `search_path`); {} for a built-in, whose code is Retrain's, or a task
    not found."""
    if reference.path is not None:
        return file_task_sources(reference.path) if reference.path.is_file() else {}
    if reference.is_builtin or reference.module is None:
        return {}
    return module_sources(reference.module, search_path)


@dataclass(frozen=True)
class HashedSources:
    """A task's source files by name, each file's sha256 by the same name, and their one hash."""

    files: Mapping[str, Path]
    hashes: Mapping[str, str]
    sha256: str


def task_sources_sha256(reference: TaskRef, search_path: Sequence[str]) -> HashedSources | None:
    """A user's task's code (task_sources), hashed; None when there is no such code. Whatever keys,
    checks or records a task's code hashes it here. A task file that imports no module of its folder
    hashes as its own sha256, as a task file always has, so that the cache entries and checkpoints of such
    a task keep their keys."""
    sources = task_sources(reference, search_path)
    if not sources:
        return None
    hashes, digest = sources_sha256(sources)
    if reference.path is not None and len(hashes) == 1:
        digest = hashes[reference.path.name]
    return HashedSources(sources, hashes, digest)


def sources_sha256(sources: Mapping[str, Path]) -> tuple[dict[str, str], str]:
    """Each source file's sha256, by name, and one hex sha256 of the names and contents together."""
    hashes = {name: file_sha256(sources[name]) for name in sorted(sources)}
    listing = "".join(f"{name}\0{digest}\n" for name, digest in hashes.items())
    return hashes, hashlib.sha256(listing.encode()).hexdigest()


def module_sources_sha256(module: str, search_path: Sequence[str]) -> str | None:
    """The one hash of a module task's source files (module_sources); None when it is not found."""
    sources = module_sources(module, search_path)
    return sources_sha256(sources)[1] if sources else None
