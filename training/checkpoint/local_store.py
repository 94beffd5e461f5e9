"""A checkpoint store in a local folder: the embedded default, or any mounted file system with hard links."""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, cast

from core.errors import CheckpointError
from training.checkpoint.store_protocol import (
    ObjectExistsError,
    ObjectNotFoundError,
    check_object_name,
    is_object_name,
)
from training.checkpoint.writeback import WritebackFile

log = logging.getLogger(__name__)

# Object names never start with '.', so a leading dot cannot collide with a real object.
_TEMP_FILE = re.compile(r"\.(?P<name>.+)\.tmp-[0-9a-f]+")


class LocalCheckpointStore:
    """Objects are plain files directly in `root`; a write goes to a hidden temp file first.

    Publishing uses `os.link`, which refuses to replace an existing file, so two writers racing for the
    same name cannot overwrite each other (a rename would silently replace the loser's target).
    """

    def __init__(self, root: Path) -> None:
        self._root = Path(root)
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CheckpointError(
                f"cannot create checkpoint folder {self._root}: {err.strerror}; "
                "expected a writable folder path"
            ) from err

    @property
    def location(self) -> str:
        return str(self._root)

    @property
    def root(self) -> Path:
        return self._root

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        final_path = self._object_path(name)
        if final_path.exists():
            # Fail before the caller spends time serialising; the link below still guards a race.
            raise self._exists_error(name)
        temp_path = self._root / f".{name}.tmp-{secrets.token_hex(8)}"
        temp_file = self._create_temp_file(temp_path)
        try:
            with temp_file:
                yield cast(BinaryIO, WritebackFile(temp_file))
                temp_file.flush()
                os.fsync(temp_file.fileno())
            self._publish(temp_path, final_path)
        finally:
            # After a successful link the object has its own directory entry; on failure this is the cleanup.
            temp_path.unlink(missing_ok=True)
        self._sync_directory()
        log.debug("published checkpoint object %s in %s", name, self._root)

    def read(self, name: str) -> bytes:
        try:
            return self._object_path(name).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFoundError(f"checkpoint object {name!r} not found in {self._root}") from None

    def names(self) -> list[str]:
        return sorted(entry.name for entry in self._scan() if entry.is_file() and is_object_name(entry.name))

    def delete(self, name: str) -> None:
        self._object_path(name).unlink(missing_ok=True)
        self._sync_directory()

    def discard_incomplete(self) -> int:
        """Remove temp files left by writes that never completed.

        Call it when no writer is active on this folder (at start-up, before resuming): a temp file of a
        write in progress looks exactly like a crashed one.
        """
        leftovers = [entry for entry in self._scan() if entry.is_file() and _TEMP_FILE.fullmatch(entry.name)]
        for entry in leftovers:
            with suppress(FileNotFoundError):
                os.unlink(entry.path)
        if leftovers:
            self._sync_directory()
            log.info("discarded %d incomplete checkpoint write(s) in %s", len(leftovers), self._root)
        return len(leftovers)

    def free_bytes(self) -> int | None:
        """What the file system holding the folder still offers this user (statvfs's available blocks)."""
        try:
            return shutil.disk_usage(self._root).free
        except OSError as err:
            raise CheckpointError(
                f"cannot read the free space of checkpoint folder {self._root}: {err.strerror}; "
                "expected an existing folder"
            ) from err

    def _object_path(self, name: str) -> Path:
        return self._root / check_object_name(name)

    def _scan(self) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(self._root) as entries:
                return list(entries)
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint folder {self._root} has disappeared; expected an existing folder"
            ) from None

    def _create_temp_file(self, temp_path: Path) -> BinaryIO:
        try:
            return cast(BinaryIO, open(temp_path, "xb"))  # the caller's `with` closes it
        except OSError as err:
            raise CheckpointError(
                f"cannot write checkpoint objects in {self._root}: {err.strerror}; expected a writable folder"
            ) from err

    def _publish(self, temp_path: Path, final_path: Path) -> None:
        try:
            os.link(temp_path, final_path)
        except FileExistsError:
            raise self._exists_error(final_path.name) from None
        except OSError as err:
            raise CheckpointError(
                f"cannot publish checkpoint object {final_path.name!r} in {self._root}: {err.strerror}; "
                "the folder must be on a file system that supports hard links"
            ) from err

    def _exists_error(self, name: str) -> ObjectExistsError:
        return ObjectExistsError(
            f"checkpoint object {name!r} already exists in {self._root}; objects are never overwritten, "
            "write under a new name"
        )

    def _sync_directory(self) -> None:
        # Without this a power loss can forget the new directory entry even though the data was fsynced.
        fd = os.open(self._root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
