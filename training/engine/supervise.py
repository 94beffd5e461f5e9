"""Follow a `retrain train` child process through its progress events.

The child runs with `--progress jsonl`, so every step and happening arrives as one JSON line on its
stdout; a supervisor (the demo, a test, an operator's script) reads them as they come, and can act at an
exact step, for instance by delivering an eviction notice, without polling or sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

Event = dict[str, Any]


class TrainingEnded(RuntimeError):
    """The process ended before the awaited event."""


class TrainingProcess:
    def __init__(
        self,
        train_args: Sequence[str],
        env: Mapping[str, str] | None = None,
        stderr: IO[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        command = [sys.executable, "-m", "training.cli", "train", *train_args, "--progress", "jsonl"]
        self.events_seen: list[Event] = []
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=dict(env if env is not None else os.environ),
            cwd=cwd,
            start_new_session=True,  # a signal meant for the training never reaches its supervisor
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def events(self) -> Iterator[Event]:
        """Events as they arrive, until the process closes its stdout."""
        stdout = self.process.stdout
        if stdout is None:
            raise RuntimeError("the training process was started without a stdout pipe")
        for line in stdout:
            if line.startswith("{"):
                event = json.loads(line)
                self.events_seen.append(event)
                yield event

    def wait_for(self, predicate: Callable[[Event], bool]) -> Event:
        for event in self.events():
            if predicate(event):
                return event
        raise TrainingEnded(
            f"training exited with code {self.process.wait()} before the awaited event; "
            f"last events: {self.events_seen[-3:]}"
        )

    def send_signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def finish(self, on_event: Callable[[Event], None] | None = None) -> int:
        """Read the remaining events, then wait for the exit code."""
        for event in self.events():
            if on_event is not None:
                on_event(event)
        return self.process.wait()
