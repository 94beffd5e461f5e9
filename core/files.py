"""Files written whole: the atomic replace and create-if-absent, a folder staged and renamed into place, a
folder made durable, the file sha256 and a published folder made read-only."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from core.errors import InputError

_HASH_CHUNK_BYTES = 1 << 20


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in chunks (a data file may not fit in memory)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def check_file_sha256(path: Path, expected: str, what: str = "file") -> None:
    """`path` holds the bytes whose sha256 is `expected` (read in chunks), or an InputError naming it: one
    line saying it cannot be read, or that it was changed since the manifest recorded it."""
    try:
        actual = file_sha256(path)
    except OSError as error:
        raise InputError(f"{path}: cannot read the {what} ({error.strerror})") from error
    if actual != expected:
        raise InputError(f"{path}: sha256 differs from the manifest, the {what} was changed")


def checked_bytes(path: Path, expected: str, what: str = "file", hint: str = "") -> bytes:
    """The bytes of `path` (a small file, read whole), whose sha256 must be `expected`; else an InputError as
    `check_file_sha256` words it, with `hint` (what to do about it) after a semicolon."""
    suffix = f"; {hint}" if hint else ""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(f"{path}: cannot read the {what} ({error.strerror}){suffix}") from error
    if hashlib.sha256(data).hexdigest() != expected:
        raise InputError(f"{path}: sha256 differs from the manifest, the {what} was changed{suffix}")
    return data


def make_read_only(folder: Path) -> None:
    """Take the write bits off every file under `folder` (published data and step outputs): a process that
    opens one to write fails loudly instead of silently changing what others reuse. Folders keep theirs,
    so that removing a version (`rm -rf`, shutil.rmtree) needs no chmod first; the content hashes that
    are checked before reuse catch what a mode cannot stop (root, or a file replaced by a rename)."""
    for parent, _, filenames in os.walk(folder):
        for name in filenames:
            path = Path(parent, name)
            path.chmod(stat.S_IMODE(path.lstat().st_mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


Content = bytes | Callable[[BinaryIO], Any]


def write_atomically(path: Path, content: Content, *, sync_folder: bool = False) -> None:
    """Replace `path` whole: readers (and a crash) see the old file or the new one, never a part.

    `content` is the bytes, or a function that writes them to a binary handle. The bytes are fsynced
    before the rename; `sync_folder` also fsyncs the folder after it, so that the new name itself survives
    a power loss (a record whose write was acknowledged must).
    """
    with _temporary_sibling(path, content) as temporary:
        os.replace(temporary, path)
    if sync_folder:
        fsync_folder(path.parent)


def create_atomically(path: Path, content: Content, *, sync_folder: bool = False) -> bool:
    """Create `path` whole if it does not exist; False, and nothing written, if it does (another writer won).

    The file is linked into place, which fails on an existing name, so two writers racing for one name
    never overwrite each other.
    """
    with _temporary_sibling(path, content) as temporary:
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
    if sync_folder:
        fsync_folder(path.parent)
    return True


@contextmanager
def _temporary_sibling(path: Path, content: Content) -> Iterator[Path]:
    """A hidden, fsynced temporary file beside `path` holding `content`, removed when the block ends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Hidden, so listings and watchers skip it; 0o666 less the umask, the mode a plain open() gives.
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            if isinstance(content, bytes):
                handle.write(content)
            else:
                content(handle)
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on disk before a name points at them
        yield temporary
    finally:
        temporary.unlink(missing_ok=True)


def fsync_folder(folder: Path) -> None:
    """Make a folder's entries durable: a file created, renamed or deleted in it survives a crash."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """A new, empty, hidden sibling of `final` to fill; when the block ends, it is renamed to `final` in one
    step, so readers (and a crash) see the whole folder or none. If the block or the rename fails, the
    sibling is removed and the error raised: the rename fails when `final` exists and is not empty (another
    writer got there first; the caller decides whether that is fine), and `final` is then left as it is.

    The sibling's name starts with '.', so listings, raw-data scans and watchers skip it; one a killed
    process left behind is never renamed into place.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.with_name(f".{final.name}.staging-{secrets.token_hex(8)}")
    staging.mkdir()  # the mode a plain mkdir of `final` gets
    try:
        yield staging
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
