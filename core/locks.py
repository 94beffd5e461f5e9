"""Holding something alone: the renewal thread that keeps a held lease alive, and the exclusive file lock
for processes sharing one machine's folder."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


class LeaseRenewal:
    """Keeps a held lease alive: calls `renew` every `every_seconds` on a daemon thread until `stop()`.

    `lost` turns true at the first renewal that fails (logged once, naming `what`; the thread then ends),
    and also once no renewal has succeeded for `valid_seconds - every_seconds`, the lease's duration less
    one period: a renewal call that hangs cannot be interrupted, and its holder must stop writing before
    the lease may have expired and another holder may have taken it. `describe` turns a failure into a
    secret-free reason for the log.
    """

    def __init__(
        self,
        renew: Callable[[], object],
        every_seconds: float,
        valid_seconds: float,
        what: str,
        describe: Callable[[BaseException], str] = lambda error: type(error).__name__,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < every_seconds < valid_seconds:
            raise ValueError(f"renewing every {every_seconds} s cannot keep a {valid_seconds} s lease")
        self._renew_call = renew
        self._every_seconds = every_seconds
        self._stale_after = valid_seconds - every_seconds
        self._what = what
        self._describe = describe
        self._clock = clock
        self._renewed_at = clock()  # the lease was just acquired (or renewed) by the caller
        self._failed = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"renew {what}"[:60], daemon=True)
        self.thread.start()

    @property
    def lost(self) -> bool:
        return self._failed or self._clock() - self._renewed_at >= self._stale_after

    def stop(self) -> None:
        """Stop renewing (waits for a renewal in progress); the caller then releases the lease itself."""
        self._stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every_seconds):
            started = self._clock()  # the service counts the new period from no earlier than this
            try:
                self._renew_call()
            except Exception as error:  # whatever stops the renewal loses the lease: the holder must know
                self._failed = True
                log.warning("lost %s: %s", self._what, self._describe(error))
                return
            self._renewed_at = started


# -- one process at a time -------------------------------------------------------------------------------

_HOLDER_BYTES = 512


@contextmanager
def exclusive_file_lock(
    path: Path, holder: str, on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold an exclusive flock(2) on `path` (created if absent) for the block, waiting as long as it takes.

    For processes sharing one machine's folder. The kernel drops a dead process's lock, so a crash never
    leaves it held; the descriptor is not inherited by child processes, so a step started meanwhile does
    not keep it either. `holder` (who holds it, for a person wondering why something waits) is written into
    the file once the lock is taken; when another process holds it, `on_wait` first gets that process's
    text ("" if it has not written it yet). A signal that raises (Ctrl-C) ends the wait.
    """
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(os.pread(descriptor, _HOLDER_BYTES, 0).decode(errors="replace").strip())
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, holder.encode(), 0)
        yield
    finally:
        os.close(descriptor)  # releases the lock
