"""A module task's source files, found without importing them, and their one hash: what a cache key and
lineage record of a task's code."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from core.files import file_sha256


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


def sources_sha256(sources: Mapping[str, Path]) -> tuple[dict[str, str], str]:
    """Each source file's sha256, by name, and one hex sha256 of the names and contents together."""
    hashes = {name: file_sha256(sources[name]) for name in sorted(sources)}
    listing = "".join(f"{name}\0{digest}\n" for name, digest in hashes.items())
    return hashes, hashlib.sha256(listing.encode()).hexdigest()


def module_sources_sha256(module: str, search_path: Sequence[str]) -> str | None:
    """The one hash of a module task's source files (module_sources); None when it is not found."""
    sources = module_sources(module, search_path)
    return sources_sha256(sources)[1] if sources else None
