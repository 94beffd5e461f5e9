"""Disks that fill up or refuse writes, for tests/training/checkpoint/test_checkpoint_faults.py.

A real tmpfs where this process may mount one (root with CAP_SYS_ADMIN); otherwise `FillingStore`, a real
store whose writes go to /dev/full once the disk is "full", so the kernel itself answers ENOSPC. Both need
nothing beyond a Debian base image (mount is in util-linux; /dev/full is in every container).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pytest

from training.checkpoint.store_protocol import CheckpointStore


@functools.cache
def can_mount() -> bool:
    """Whether this process may mount a tmpfs (tried for real, then undone)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    with tempfile.TemporaryDirectory() as folder:
        tried = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", folder], capture_output=True
        )
        if tried.returncode != 0:
            return False
        subprocess.run(["umount", folder], check=True)
    return True


@contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def fill_up(folder: Path) -> None:
    """Take every free byte of the file system under `folder`, as another program filling the disk would."""
    with open(folder / "filler", "wb", buffering=0) as filler, pytest.raises(OSError) as full:
        while True:
            filler.write(bytes(64 * 1024))
    assert full.value.errno == errno.ENOSPC


class FillingStore:
    """A real store whose disk can fill up: once `fill_up()` is called, every byte written into any object
    goes to /dev/full, whose writes the kernel fails with ENOSPC. Reads, deletes and cleanup are the real
    store's, which sees each failure as it would see a full disk's."""

    def __init__(self, inner: CheckpointStore, fails: Callable[[str], bool] = lambda name: True) -> None:
        self._inner = inner
        self._fails = fails
        self._full = False

    def fill_up(self) -> None:
        self._full = True

    @property
    def location(self) -> str:
        return self._inner.location

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        with self._inner.writer(name) as file:
            if self._full and self._fails(name):
                with open("/dev/full", "wb", buffering=0) as full:
                    yield full
            else:
                yield file

    def read(self, name: str) -> bytes:
        return self._inner.read(name)

    def names(self) -> list[str]:
        return self._inner.names()

    def delete(self, name: str) -> None:
        self._inner.delete(name)

    def discard_incomplete(self) -> int:
        return self._inner.discard_incomplete()

    def free_bytes(self) -> int | None:
        return self._inner.free_bytes()


PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


def obey_file_modes_as_root() -> None:
    """In the child, before it execs: root ignores a folder's mode bits through CAP_DAC_OVERRIDE. Dropped
    from the bounding set, the exec'd program lacks it, and a read-only folder is read-only to it too."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
