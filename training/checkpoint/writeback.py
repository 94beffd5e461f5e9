"""Early writeback: a file that asks the kernel to start writing its pages to the disk as they arrive.

A checkpoint object is written into the page cache and then fsynced. Left alone, the kernel starts moving
dirty pages to the disk only when they age or pile up, so the disk idles while the save serialises and
copies, and the final fsync then waits for the whole object at once. Asking for writeback of each chunk as
soon as it is written (Linux's `sync_file_range(SYNC_FILE_RANGE_WRITE)`, which only starts the I/O and does
not wait for it) keeps the disk busy alongside the CPU work, and the fsync waits only for the tail. It is the
same hint as RocksDB's `bytes_per_sync` and PostgreSQL's `checkpoint_flush_after`.

It is only a hint: durability still comes from the fsync the store makes before publishing. Where the call
does not exist (not Linux) or the file system refuses it, writes go straight through, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Callable
from typing import BinaryIO

log = logging.getLogger(__name__)

# Big enough that the hint costs nothing per call, small enough that the disk starts early.
CHUNK_BYTES = 4 << 20
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()


class WritebackFile:
    """Writes to `target` (a file opened for writing at offset 0), starting the disk's writeback of each
    `chunk_bytes` written. Everything else a writer needs (`flush`, `fileno`) passes through."""

    def __init__(self, target: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._target = target
        self._chunk = chunk_bytes
        self._written = 0  # bytes written so far
        self._started = 0  # bytes whose writeback was asked for
        self._hint = _sync_file_range

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        for start in range(0, total, self._chunk):
            self._target.write(view[start : start + self._chunk])
            self._written += min(self._chunk, total - start)
            if self._written - self._started >= self._chunk:
                self._start_writeback()
        return total

    def flush(self) -> None:
        self._target.flush()

    def fileno(self) -> int:
        return self._target.fileno()

    def _start_writeback(self) -> None:
        if self._hint is None:
            self._started = self._written
            return
        self._target.flush()  # the hint covers what the kernel has, not what Python still buffers
        length = self._written - self._started
        if self._hint(self._target.fileno(), self._started, length, _SYNC_FILE_RANGE_WRITE) != 0:
            error = ctypes.get_errno()
            log.debug("early writeback is off for this file: %s", os.strerror(error))
            self._hint = None  # a file system without it (EINVAL, ENOSYS): plain writes, fsync at the end
        self._started = self._written
