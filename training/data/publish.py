"""Publish a prepared data version: every file appears at once, the manifest last, or nothing does."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

from core.errors import InputError
from core.files import staged_folder


def publish(out: Path, files: Mapping[str, bytes | Path]) -> None:
    """Make `files` appear in `out`, in order (so the manifest, last, marks a complete version). Each is
    given as its bytes, or as a file written already (a part of this version, or one an earlier version
    shares with it), which is hard-linked where the file system allows and copied where it does not.

    A new `out` is staged beside it and renamed into place; an existing empty one (an Azure ML output
    mount cannot be replaced) is staged inside it and filled by renames. On failure nothing is left.
    """
    created_parents = make_parents(out.parent)
    try:
        if out.exists():
            _fill(out, files)
        else:
            with staged_folder(out) as staging:
                for name, data in files.items():
                    _write_durably(staging / name, data)
    except BaseException as error:
        for parent in reversed(created_parents):
            with contextlib.suppress(OSError):
                parent.rmdir()
        if isinstance(error, OSError):
            raise InputError(
                f"{out}: cannot write the prepared data ({error}); expected a writable folder"
            ) from error
        raise


def _fill(out: Path, files: Mapping[str, bytes]) -> None:
    """Fill an existing (empty) `out` from a folder staged inside it, one rename per file, in order; on
    failure the files renamed so far are removed again."""
    staging = out / f".{out.name}.staging-{uuid.uuid4().hex}"
    moved: list[Path] = []
    try:
        staging.mkdir()
        for name, data in files.items():
            _write_durably(staging / name, data)
        for name in files:
            os.replace(staging / name, out / name)
            moved.append(out / name)
        staging.rmdir()
    except BaseException:
        for path in reversed(moved):
            path.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        raise


def make_parents(folder: Path) -> list[Path]:
    """Create `folder` and any missing ancestors; return the ones created, outermost first."""
    missing = [path for path in (folder, *folder.parents) if not path.exists()][::-1]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"{folder}: cannot create the output's parent folder ({error})") from error
    return missing


def _write_durably(path: Path, data: bytes | Path) -> None:
    if isinstance(data, Path):
        try:
            os.link(data, path)  # shares the bytes: an earlier version's files are never written again
            return
        except OSError:  # another file system (a mounted input), or one without hard links
            shutil.copyfile(data, path)
        with path.open("rb") as stream:
            os.fsync(stream.fileno())
        return
    with path.open("wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
