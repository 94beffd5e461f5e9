"""Starters kept between the runs of one process.

A starter spends seconds of CPU importing torch and MLflow before it forks a step (warm.py). A process that
runs one pipeline after another (the front door's local submitter, the demo, a test session) would pay that
for every run; instead, the launcher of a run that has ended hands its starter back here, idle, and the
next run's launcher takes it if it serves that run's folder and interpreter settings. Nothing a step sees
depends on which run its starter served first: a starter never runs a step itself, so its state is what its
imports made it, and each step gets its own environment and folder. What could differ is the code: a
starter refuses to fork from source files that changed since it imported them
(training/warm/loaded_sources.py), and the launcher then starts a new one.

At most KEEP starters wait here, each holding the memory of its imports. They leave with the process: at
exit, or, should it die, when their stdin closes.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping
from pathlib import Path

from components.local.starter import StarterProcess

KEEP = 1  # runs in one process come one after another; two at once is rare and each may start its own


class StarterPool:
    """Idle starters, each with the interpreter it runs; safe to use from several threads."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._idle: list[tuple[str, StarterProcess]] = []
        self._lock = threading.Lock()

    def take(self, python: str, cwd: Path, env: Mapping[str, str]) -> StarterProcess | None:
        """An idle starter of `python` that serves steps run in `cwd` with `env`, now the caller's."""
        with self._lock:
            for index, (interpreter, starter) in enumerate(self._idle):
                if interpreter == python and starter.serves(cwd, env) and starter.process.poll() is None:
                    del self._idle[index]
                    return starter
        return None

    def give_back(self, python: str, starter: StarterProcess) -> None:
        """Keep `starter`, idle, for the next run; the oldest beyond KEEP are ended."""
        with self._lock:
            self._idle.insert(0, (python, starter))
            extra, self._idle = self._idle[self._keep :], self._idle[: self._keep]
        for _, old in extra:
            old.close()

    def close(self) -> None:
        """End every idle starter."""
        with self._lock:
            idle, self._idle = self._idle, []
        for _, starter in idle:
            starter.close()


IDLE_STARTERS = StarterPool()  # this process's
atexit.register(IDLE_STARTERS.close)
