"""The record store in a local folder (Unix): `retrain` on one machine, and the tests' twin of Blob Storage.

Create-if-absent is link(2) of a complete temporary file, which fails when the name exists; a replace
compares the version and renames under an flock(2) lock, which serialises threads and processes alike; the
folder is fsynced after each write, so an acknowledged record survives a crash. A record's file is its tag
line, then its bytes; its version is the file's hash. The lease is an flock on a lock file, which the kernel
releases when its process dies, however it dies.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.files import create_atomically, fsync_folder, write_atomically
from function_app.ledger.records import LedgerError
from function_app.ledger.store import (
    UNREADABLE,
    Holder,
    Listed,
    Stored,
    check_name,
    check_tag,
    holder_stamp,
    quarantine_name,
    read_holder_stamp,
)

_TAG_LINE = b"#tag="
_LOCKS = ".locks"
_STRIPES = 64  # replace locks: one per stripe of names, so unrelated records rarely wait for each other


@dataclass
class _FileLease:
    lost: bool = False  # a file lock is kept until its descriptor closes: never lost while held


class LocalRecordStore:
    def __init__(self, folder: Path) -> None:
        self._folder = Path(folder)
        try:
            (self._folder / _LOCKS).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise LedgerError(
                f"ledger folder {folder}: cannot create it ({err.strerror}); expected a writable folder"
            ) from None
        self.location = str(self._folder)

    def create(self, name: str, data: bytes, tag: str = "") -> bool:
        return create_atomically(self._path(name), _encode(data, tag), sync_folder=True)

    def read(self, name: str) -> Stored | None:
        path = self._path(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        data, tag = _decode(raw)
        return Stored(data, _version(raw), tag)

    def replace(self, name: str, data: bytes, version: str, tag: str = "") -> bool:
        path = self._path(name)
        with self._lock(_stripe(name)):
            try:
                current = path.read_bytes()
            except FileNotFoundError:
                return False
            if _version(current) != version:
                return False
            write_atomically(path, _encode(data, tag), sync_folder=True)
        return True

    def list(self, prefix: str) -> Iterator[Listed]:
        # A prefix of names, as Blob Storage matches it: 'claims/a' lists 'claims/a1/...' and 'claims/ab'.
        parent = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        folder = self._folder / parent if parent else self._folder
        if not folder.is_dir():
            return
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(self._folder).as_posix()
            hidden = any(part.startswith(".") for part in path.relative_to(self._folder).parts)
            if hidden or not relative.startswith(prefix) or path.is_dir():
                continue  # temporary files, the locks, and names beside the prefix
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            yield Listed(relative, _version(raw), _decode(raw)[1])

    def quarantine(self, name: str, version: str) -> str | None:
        path = self._folder / name
        if not path.resolve().is_relative_to(self._folder.resolve()):
            raise LedgerError(f"ledger record {name!r}: not in the ledger folder {self._folder}")
        target = quarantine_name(name, version)
        with self._lock(_stripe(name)):  # the lock `replace` takes: the record cannot change meanwhile
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                return target  # another reader moved it first
            if _version(raw) != version:
                return None
            create_atomically(self._path(target), _encode(raw, ""), sync_folder=True)  # False: copied already
            path.unlink(missing_ok=True)
            fsync_folder(path.parent)  # the delete survives a crash, as a write does
        return target

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[_FileLease | None]:
        descriptor = os.open(self._hold_path(name), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                yield None
                return
            # Who holds it, for a refused flush to say; written into the lock file itself, which only the
            # holder writes (a reader that sees it half-written reports the holder as unknown).
            stamp = json.dumps(holder_stamp()).encode()
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, stamp, 0)
            yield _FileLease()
        finally:
            os.close(descriptor)  # releases the lock

    def holder(self, name: str) -> Holder | None:
        path = self._hold_path(name)
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:  # a shared lock taken at once means nobody holds it
                fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            else:
                return None
            return read_holder_stamp(os.pread(descriptor, 4096, 0), dies_with_holder=True)
        finally:
            os.close(descriptor)

    def _hold_path(self, name: str) -> Path:
        return self._lock_path(f"hold-{check_name(name).replace('/', '~')}")

    def _path(self, name: str) -> Path:
        return self._folder / check_name(name)

    def _lock_path(self, name: str) -> Path:
        return self._folder / _LOCKS / f"{name}.lock"

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        descriptor = os.open(self._lock_path(name), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)


def _encode(data: bytes, tag: str) -> bytes:
    return _TAG_LINE + check_tag(tag).encode() + b"\n" + data


def _decode(raw: bytes) -> tuple[bytes, str]:
    """A record file's bytes and tag; a file without its tag line (empty, truncated, put there by hand) is
    all bytes and UNREADABLE, for the ledger to move aside."""
    head, newline, data = raw.partition(b"\n")
    if not head.startswith(_TAG_LINE) or not newline:
        return raw, UNREADABLE
    return data, head[len(_TAG_LINE) :].decode("ascii", "replace")


def _stripe(name: str) -> str:
    return f"r-{int(hashlib.sha256(name.encode()).hexdigest(), 16) % _STRIPES}"


def _version(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:32]
