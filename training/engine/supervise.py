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
from typing import IO, Any, Protocol

Event = dict[str, Any]


class TrainingEnded(RuntimeError):
    """The process ended before the awaited event."""


class StartedProcess(Protocol):
    """What a supervisor needs of the started command: `subprocess.Popen`'s pid, poll, wait and signals."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, signum: int) -> None: ...


# How the command is started when not as a fresh process: (argv, env, stderr, cwd) to the process and the
# text stream of its stdout. The process leads a session of its own, as the fresh one does.
StartCommand = Callable[
    [list[str], dict[str, str], IO[str] | None, Path | None], tuple[StartedProcess, IO[str]]
]


class TrainingProcess:
    def __init__(
        self,
        train_args: Sequence[str],
        env: Mapping[str, str] | None = None,
        stderr: IO[str] | None = None,
        cwd: Path | None = None,
        start: StartCommand | None = None,
    ) -> None:
        command = [sys.executable, "-m", "training.cli", "train", *train_args, "--progress", "jsonl"]
        environ = dict(env if env is not None else os.environ)
        self.events_seen: list[Event] = []
        self.process: StartedProcess
        if start is not None:
            self.process, self.stdout = start(command, environ, stderr, cwd)
            return
        fresh = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=environ,
            cwd=cwd,
            start_new_session=True,  # a signal meant for the training never reaches its supervisor
        )
        assert fresh.stdout is not None  # a pipe was asked for
        self.process, self.stdout = fresh, fresh.stdout

    @property
    def pid(self) -> int:
        return self.process.pid

    def events(self) -> Iterator[Event]:
        """Events as they arrive, until the process closes its stdout."""
        for line in self.stdout:
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
