"""Files kept once: a local content-addressed object store, and folders made of hard links into it.

A pinned data version is a folder of raw files that never changes. Stored as copies, every version costs
all of its data again, though most of it is the last version's; stored as hard links to objects kept once
by their sha256, a version costs only the files no earlier version had, and a reader still sees an
ordinary read-only folder. An object is one inode, and each folder holding it is one more link to that
inode: an object that no folder links (`st_nlink` 1) is unreferenced, and `collect` removes exactly those.
So removing a version is removing its folder, and nothing else has to know which objects it used.

Layout under the store's root:

    sha256/ab/abcdef...      an object, named by the sha256 of its bytes, read-only
    aliases/cd/cdef01...     an object's digest under another name for its bytes: a blob's URL and eTag
                             say which bytes they are before anyone downloads them
    tmp/                     objects being written, renamed into place when whole and fsynced
    .lock                    writers hold it shared, `collect` exclusively: an object is never collected
                             between a writer's finding it and linking it

A file system without hard links between the store and a folder (another device, or one that refuses
them) gets a copy instead, with one warning: the version is as right, only not shared.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import shutil
import stat
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core.files import file_sha256

log = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20
_DIGEST = re.compile(r"[0-9a-f]{64}")
# Errors of os.link that mean "no hard link here", not "something is wrong": another device, a file system
# that has none or refuses them, an inode at its file system's most links.
_NO_LINK_ERRNOS = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}


class ObjectMismatch(ValueError):
    """Bytes given for an expected digest hash to another one (the source changed while it was read)."""

    def __init__(self, expected: str, found: str) -> None:
        super().__init__(f"sha256 {found[:12]}..., expected {expected[:12]}...")
        self.expected = expected
        self.found = found


@dataclass(frozen=True)
class Collected:
    """What one collection removed: objects no folder links any more, their bytes, and stale aliases."""

    objects: int
    bytes: int
    aliases: int


def _inodes_under(folders: Iterable[Path]) -> Iterator[tuple[int, int]]:
    for folder in folders:
        for parent, _, filenames in os.walk(folder):
            for name in filenames:
                status = os.lstat(os.path.join(parent, name))
                yield status.st_dev, status.st_ino


def bytes_stored(folder: Path) -> int:
    """The bytes of the files under `folder`, each inode counted once however many links it has: what the
    folder costs on disk, as `du` counts it (hard links to one object are one object)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for parent, _, filenames in os.walk(folder):
        for name in filenames:
            status = os.lstat(os.path.join(parent, name))
            if stat.S_ISREG(status.st_mode) and (status.st_dev, status.st_ino) not in seen:
                seen.add((status.st_dev, status.st_ino))
                total += status.st_size
    return total


class ObjectStore:
    """A local content-addressed store at `root` (created on first write)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"object digest {digest!r}: expected 64 lowercase hex digits (a sha256)")
        return self.root / "sha256" / digest[:2] / digest

    def holds(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def verify(self, digest: str) -> bool:
        """Whether the object is there and its bytes still hash to its name (root ignores modes)."""
        try:
            return file_sha256(self.path(digest)) == digest
        except FileNotFoundError:
            return False

    @contextmanager
    def writing(self) -> Iterator[ObjectStore]:
        """Hold the store for writing (shared with other writers, never with `collect`): everything put or
        linked inside the block is linked from its folder before a collection can look at it."""
        with self._locked(fcntl.LOCK_SH):
            yield self

    def put_bytes(self, data: bytes, *, expected: str | None = None) -> str:
        """Keep `data` as an object and return its digest; see `put_file`."""
        return self._put(lambda handle: handle.write(data), expected)

    def put_file(self, source: Path, *, expected: str | None = None) -> str:
        """Keep a copy of `source` as an object and return its digest, read once, hashed as it is copied.

        With `expected`, an object already there whose bytes still hash to it is used as it is, without
        reading `source`; bytes that hash otherwise raise ObjectMismatch and keep nothing. An object whose
        bytes no longer hash to its name (changed in place: root ignores modes) is never linked again:
        these bytes take its place, and folders still linking the damaged inode find it by their own
        checks."""

        def copy(handle: object) -> None:
            with Path(source).open("rb") as stream:
                shutil.copyfileobj(stream, handle, _CHUNK_BYTES)  # type: ignore[arg-type]

        return self._put(copy, expected)

    def link(self, digest: str, target: Path) -> None:
        """Make `target` (a new name) the object `digest`: a hard link, or a copy where none can be made."""
        source = self.path(digest)
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError as error:
            if error.errno not in _NO_LINK_ERRNOS:
                raise
            log.warning(
                "cannot hard-link %s into %s (%s); copying it: this version costs its bytes again",
                source, target, error.strerror,
            )  # fmt: skip
            shutil.copyfile(source, target)
            os.chmod(target, stat.S_IMODE(os.stat(source).st_mode))

    def alias(self, name: str) -> str | None:
        """The digest kept under another name for the same bytes, when its object is still here."""
        return self._aliased(self._alias_path(name))

    def set_alias(self, name: str, digest: str) -> None:
        path = self._alias_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        temporary.write_text(digest, encoding="ascii")
        os.replace(temporary, path)

    @contextmanager
    def exclusively(self) -> Iterator[ObjectStore]:
        """Hold the store alone: no writer is between finding an object (or a folder of links) and linking
        it while the block runs. `collect` holds it so; a caller that removes folders first holds it around
        both (a second hold from the same process would wait on the first)."""
        with self._locked(fcntl.LOCK_EX):
            yield self

    def collect(self) -> Collected:
        """Remove every object that no folder links any more, and the aliases that name none."""
        with self.exclusively():
            return self.collect_held()

    def collect_held(self, leaving: Iterable[Path] = (), dry_run: bool = False) -> Collected:
        """`collect`, for a caller that holds the store `exclusively`. With `dry_run` nothing is removed,
        and the objects counted are those that would be unlinked once the folders `leaving` are gone."""
        if not self.root.is_dir():
            return Collected(0, 0, 0)
        going = Counter(_inodes_under(leaving)) if dry_run else Counter[tuple[int, int]]()
        objects = freed = aliases = 0
        unlinked: set[str] = set()
        for path in sorted((self.root / "sha256").glob("*/*")):
            status = path.lstat()
            if stat.S_ISREG(status.st_mode) and status.st_nlink - going[(status.st_dev, status.st_ino)] == 1:
                objects, freed = objects + 1, freed + status.st_size
                unlinked.add(path.name)
                if not dry_run:
                    path.unlink()
        for path in sorted((self.root / "aliases").glob("*/*")):
            digest = self._aliased(path)
            if digest is None or digest in unlinked:
                aliases += 1
                if not dry_run:
                    path.unlink(missing_ok=True)
        if not dry_run:
            shutil.rmtree(self.root / "tmp", ignore_errors=True)  # a killed writer's; none is writing now
        return Collected(objects, freed, aliases)

    def _aliased(self, alias_file: Path) -> str | None:
        try:
            digest = alias_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return digest if _DIGEST.fullmatch(digest) and self.holds(digest) else None

    def _alias_path(self, name: str) -> Path:
        key = hashlib.sha256(name.encode()).hexdigest()
        return self.root / "aliases" / key[:2] / key

    def _put(self, write: object, expected: str | None) -> str:
        if expected is not None and self.verify(expected):
            return expected
        staging = self.root / "tmp"
        staging.mkdir(parents=True, exist_ok=True)
        temporary = staging / f"{secrets.token_hex(8)}.tmp"
        try:
            with temporary.open("xb") as raw:
                hashing = _HashingWriter(raw)
                write(hashing)  # type: ignore[operator]
                raw.flush()
                os.fsync(raw.fileno())
            digest = hashing.digest.hexdigest()
            if expected is not None and digest != expected:
                raise ObjectMismatch(expected, digest)
            temporary.chmod(0o444)
            final = self.path(digest)
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists() and not self.verify(digest):
                log.warning("object %s was changed in place; replaced by a fresh copy", final)
                os.replace(temporary, final)
            else:
                with contextlib.suppress(FileExistsError):  # one already there is these very bytes
                    os.link(temporary, final)
        finally:
            temporary.unlink(missing_ok=True)
        return digest

    @contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, mode)
            yield
        finally:
            os.close(descriptor)  # closing releases the lock


class _HashingWriter:
    """A binary handle that hashes what passes through it."""

    def __init__(self, raw: object) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self._raw.write(data)  # type: ignore[attr-defined]
