"""An injected eviction: SIGTERM to a pipeline's train step once its first checkpoint is durable, as a
low-priority node receives an eviction notice."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from training.checkpoint.records import RECORD_SUFFIX

_POLL_SECONDS = 0.005
_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class Eviction:
    """What was done: the process group signalled, and the checkpoint that was durable when it was."""

    pid: int
    after_checkpoint: str


class EvictOnFirstCheckpoint:
    """A runner's `on_process_started` hook: the first attempt of the `train` step is evicted once a new
    checkpoint record appears under `checkpoints` (records are written after their data: it is durable).
    Later attempts, and other steps, run undisturbed."""

    def __init__(self, checkpoints: Path) -> None:
        self._checkpoints = checkpoints
        self._thread: threading.Thread | None = None
        self.eviction: Eviction | None = None
        self.error: str | None = None

    def __call__(self, step: str, attempt: int, pid: int) -> None:
        if step != "train" or attempt != 1 or self._thread is not None:
            return
        existing = self._records()
        self._thread = threading.Thread(target=self._evict, args=(pid, existing), daemon=True)
        self._thread.start()

    def wait(self) -> Eviction | None:
        """The eviction, once the watching thread is done (None if the train step never started)."""
        if self._thread is not None:
            self._thread.join()
        return self.eviction

    def _records(self) -> set[Path]:
        return set(self._checkpoints.glob(f"*/*{RECORD_SUFFIX}")) if self._checkpoints.is_dir() else set()

    def _evict(self, pid: int, existing: set[Path]) -> None:
        deadline = time.monotonic() + _TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            new = self._records() - existing
            if new:
                try:
                    os.killpg(pid, signal.SIGTERM)
                except ProcessLookupError:
                    self.error = "the train step ended before its eviction notice"
                    return
                self.eviction = Eviction(pid, min(new).stem)
                return
            if not _alive(pid):
                self.error = "the train step ended before its first checkpoint"
                return
            time.sleep(_POLL_SECONDS)
        self.error = f"no checkpoint under {self._checkpoints} within {_TIMEOUT_SECONDS:.0f} s"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
