"""Prepare what fits: a task's prepare, run again without the raw files it rejected.

A task's prepare raises `RawFilesRejected` (core/rejected_inputs.py) naming the raw files that do not fit
its data; each is left out with one warning line, and the task prepares the rest. The task is handed a view
of the raw folder that holds every other file (links to the originals, which a pinned data version keeps
read-only), so its own listing of its folder sees exactly those: the task's contract is unchanged, and a
user's task rejects a file by raising the same error. Every round leaves out at least one more file, so
this ends with a data version, or with an error once nothing that fits is left.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from core.errors import InputError
from core.rejected_inputs import RawFilesRejected, RejectedFile, names
from core.text import escaped

log = logging.getLogger(__name__)


def prepare_fitting(prepare: Callable[[Path], str], raw: Path) -> tuple[str, tuple[RejectedFile, ...]]:
    """`prepare(raw)`, or, when it rejects raw files, `prepare` of a view of `raw` without them, until it
    rejects none: the data version and every file left out (in the order they were rejected)."""
    raw = Path(raw)
    rejected: dict[str, RejectedFile] = {}
    first: RawFilesRejected | None = None
    with tempfile.TemporaryDirectory(prefix="retrain-fitting-") as scratch:
        source = raw
        for round_number in range(1, _file_count(raw) + 2):
            try:
                version = prepare(source)
            except RawFilesRejected as error:
                new = [file for file in error.files if file.name not in rejected]
                if not new:  # it rejects a file it was not given: its own error stands
                    raise
                first = first or error
                for file in new:
                    rejected[file.name] = file
                    log.warning("left out raw file %s", file.line())
                if not _files_left(raw, rejected):
                    raise _every_file_rejected(first, rejected) from None
                source = _view_without(raw, rejected, Path(scratch) / str(round_number) / raw.name)
            except InputError as error:
                if not rejected:
                    raise
                message = str(error).replace(str(source), str(raw))
                raise InputError(
                    f"{message} (after leaving out {names(rejected.values())}, which do not fit)"
                ) from None
            else:
                return version, tuple(rejected.values())
    raise InputError(f"{escaped(raw)}: its task kept rejecting raw files; expected it to prepare the others")


def _every_file_rejected(first: RawFilesRejected, rejected: dict[str, RejectedFile]) -> InputError:
    """No raw file fits: the first rejection's own message (it names its file), and how many more."""
    if len(rejected) == len(first.files):
        return first
    return RawFilesRejected(tuple(rejected.values()), first.first_message)


def _file_count(raw: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(raw))


def _relative_files(raw: Path) -> list[tuple[str, Path]]:
    """Every file below `raw` (links not followed), by its '/'-separated path below it."""
    found = []
    for parent, _, files in os.walk(raw):
        for name in files:
            path = Path(parent, name)
            found.append((path.relative_to(raw).as_posix(), path))
    return found


def _files_left(raw: Path, rejected: dict[str, RejectedFile]) -> bool:
    return any(
        name not in rejected and not any(part.startswith(".") for part in name.split("/"))
        for name, _ in _relative_files(raw)
    )


def _view_without(raw: Path, rejected: dict[str, RejectedFile], view: Path) -> Path:
    """A folder laid out as `raw`, each file but the rejected a link to its original."""
    view.mkdir(parents=True)
    for name, path in _relative_files(raw):
        if name in rejected:
            continue
        target = view / name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.abspath(path), target)
    return view
