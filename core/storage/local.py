"""The storage seam in a local folder (Unix): records as files written whole, leases as flock(2) locks.

Records: create-if-absent is link(2) of a complete temporary file, which fails when the name exists; a
replace or delete compares the version and renames or unlinks under an flock lock, which serialises threads
and processes alike; the folder is fsynced after each write, so an acknowledged record survives a crash. A
record's file is its tag line, then its bytes; its version is the file's hash. Locks and leases live in the
hidden `.locks/` folder, which no listing shows.

Leases: an exclusive flock on a lease file that holds its holder's bytes; the kernel releases it when its
process dies, however it dies. A flock is per machine: a folder mounted on several nodes needs the Blob
twin for a lease that holds across nodes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from core.files import create_atomically, fsync_folder, write_atomically
from core.storage.leases import HeldBy
from core.storage.records import UNREADABLE, ErrorType, Listed, Stored, check_name, check_tag, lease_file_name

_TAG_LINE = b"#tag="
_LOCKS = ".locks"
_STRIPES = 64  # replace locks: one per stripe of names, so unrelated records rarely wait for each other
_HOLDER_BYTES = 4096


class LocalRecords:
    """The records in `folder` (created if absent); errors are `error`s naming the `owner` ("ledger")."""

    def __init__(self, folder: Path, owner: str, error: ErrorType) -> None:
        self._folder = Path(folder)
        self._owner, self._error = owner, error
        try:
            (self._folder / _LOCKS).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise error(
                f"{owner} folder {folder}: cannot create it ({err.strerror}); expected a writable folder"
            ) from None
        self.location = str(self._folder)

    def create(self, name: str, data: bytes, tag: str = "") -> bool:
        return create_atomically(self._path(name), self._encode(data, tag), sync_folder=True)

    def read(self, name: str) -> Stored | None:
        try:
            raw = self._listed_path(name).read_bytes()
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
            write_atomically(path, self._encode(data, tag), sync_folder=True)
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

    def delete(self, name: str, version: str | None = None) -> bool:
        path = self._listed_path(name)
        with self._lock(_stripe(name)):  # the lock `replace` takes: the record cannot change meanwhile
            if version is not None:
                try:
                    if _version(path.read_bytes()) != version:
                        return False
                except FileNotFoundError:
                    return True
            path.unlink(missing_ok=True)
            fsync_folder(path.parent)  # the delete survives a crash, as a write does
        return True

    def lease(self, name: str) -> LocalLease:
        path = (
            self._folder / _LOCKS / f"hold-{lease_file_name(check_name(name, self._owner, self._error))}.lock"
        )
        return LocalLease(path, f"{self._owner} lease file", self._error)

    def _path(self, name: str) -> Path:
        return self._folder / check_name(name, self._owner, self._error)

    def _listed_path(self, name: str) -> Path:
        # A name as listed, which may be a stray file's: any path that stays inside the folder.
        path = self._folder / name
        if not name or not path.resolve().is_relative_to(self._folder.resolve()):
            raise self._error(
                f"{self._owner} record {name!r}: not in the {self._owner} folder {self._folder}"
            )
        return path

    @contextlib.contextmanager
    def _lock(self, stripe: str) -> Iterator[None]:
        descriptor = os.open(self._folder / _LOCKS / f"{stripe}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)

    def _encode(self, data: bytes, tag: str) -> bytes:
        return _TAG_LINE + check_tag(tag, self._owner, self._error).encode() + b"\n" + data


def _decode(raw: bytes) -> tuple[bytes, str]:
    """A record file's bytes and tag; a file without its tag line (empty, truncated, put there by hand) is
    all bytes and UNREADABLE, for its owner to move aside."""
    head, newline, data = raw.partition(b"\n")
    if not head.startswith(_TAG_LINE) or not newline:
        return raw, UNREADABLE
    return data, head[len(_TAG_LINE) :].decode("ascii", "replace")


def _stripe(name: str) -> str:
    return f"r-{int(hashlib.sha256(name.encode()).hexdigest(), 16) % _STRIPES}"


def _version(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:32]


class LocalLease:
    """An exclusive flock on the file `path` (created, with its folder, if absent), which holds the holder's
    bytes while it is held. Failures to use the file are `error`s naming it as `what`."""

    def __init__(self, path: Path, what: str, error: ErrorType) -> None:
        self._path = Path(path)
        self._what, self._error = what, error
        self._descriptor: int | None = None

    @property
    def location(self) -> str:
        return str(self._path)

    @property
    def lost(self) -> bool:
        # A flock lasts as long as its descriptor; it is lost only if someone removed or replaced the file,
        # after which another holder could lock a new one.
        return self._descriptor is not None and not self._is_the_file(self._descriptor)

    def take(self, holder: bytes, *, wait: bool = False) -> bool:
        """Take the lock (`wait`: as long as it takes; a signal that raises, like Ctrl-C, ends the wait)."""
        if self._descriptor is not None:
            raise RuntimeError(f"{self._what} {self._path} is already held by this object")
        descriptor = self._open(os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not self._is_the_file(descriptor):  # removed between our open and our lock
                os.close(descriptor)
                return self.take(holder, wait=wait) if wait else False
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, holder, 0)
        except OSError as err:
            os.close(descriptor)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN) and not wait:
                return False
            raise self._failure("lock", err) from None
        except BaseException:
            os.close(descriptor)
            raise
        self._descriptor = descriptor
        return True

    def release(self) -> None:
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is None:
            return
        with contextlib.suppress(OSError):  # it names nobody once released; the lock goes with the close
            os.ftruncate(descriptor, 0)
        os.close(descriptor)

    def holder(self) -> HeldBy | None:
        try:
            descriptor = os.open(self._path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise self._failure("read", err) from None
        try:
            try:  # a shared lock taken at once means nobody holds it
                fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise self._failure("read", err) from None
            else:
                return None
            # Only the holder writes the file: a reader that sees it half-written reports it unreadable.
            return HeldBy(os.pread(descriptor, _HOLDER_BYTES, 0), dies_with_holder=True)
        finally:
            os.close(descriptor)

    def _open(self, flags: int) -> int:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self._path, flags, 0o644)
        except OSError as err:
            raise self._failure("open", err) from None

    def _is_the_file(self, descriptor: int) -> bool:
        try:
            found = os.stat(self._path)
        except OSError:
            return False
        opened = os.fstat(descriptor)
        return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)

    def _failure(self, action: str, err: OSError) -> Exception:
        return self._error(
            f"cannot {action} {self._what} {self._path}: {err.strerror}; expected a writable folder"
        )


@contextlib.contextmanager
def exclusive_file_lock(
    path: Path, holder: str, on_wait: Callable[[str], None] | None = None, error: ErrorType = OSError
) -> Iterator[None]:
    """Hold the local lease on `path` for the block, waiting as long as it takes.

    For processes sharing one machine's folder. The kernel drops a dead process's lock, so a crash never
    leaves it held; the descriptor is not inherited by child processes, so a step started meanwhile does
    not keep it either. `holder` (who holds it, for a person wondering why something waits) is written into
    the file once the lock is taken; when another process holds it, `on_wait` first gets that process's
    text ("" if it has not written it yet). A signal that raises (Ctrl-C) ends the wait.
    """
    lease = LocalLease(path, "lock file", error)
    if not lease.take(holder.encode()):
        if on_wait is not None:
            held = lease.holder()
            on_wait(held.stamp.decode(errors="replace").strip() if held else "")
        lease.take(holder.encode(), wait=True)
    try:
        yield
    finally:
        lease.release()
