"""`retrain` commands forked from one warm starter per test process, as a local run's steps are.

A fresh `retrain train` spends about 6 s of CPU importing torch, torch's compiler and MLflow before it
trains for one; the training tests start some forty of them. Forked by the starter a local run uses
(components/local/warm.py), each skips those imports. What a test asserts of a training (its weights, its
resumes, its process tree, its signals) is the same either way: tests/training/warm/test_warm_start.py holds
a forked command to a fresh one, and the tests of a launcher's own lifecycle (test_orphan_workers.py,
test_checkpoint_lease.py, test_warm_switch.py) still start it fresh.

Its events arrive as a fresh process's do, line by line as they are written: the starter appends the
child's stdout to a FIFO the test reads.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import IO

from components.local.warm import WarmLauncher
from training.engine.supervise import StartCommand, StartedProcess, TrainingProcess

COMMAND_TIMEOUT_S = 600.0  # a bound on a command that hangs, never expected to be reached


class WarmStarts:
    """Starts commands forked from one starter, serving the folder and interpreter settings it began
    with; `close` ends it."""

    def __init__(self, cwd: Path, environ: dict[str, str]) -> None:
        self._cwd = cwd
        self._launcher = WarmLauncher(sys.executable)
        self._launcher.warm_up(cwd, environ)

    def training(
        self,
        train_args: Sequence[str],
        env: dict[str, str] | None = None,
        stderr: IO[str] | None = None,
        pipe_bytes: int | None = None,
    ) -> TrainingProcess:
        """`TrainingProcess(train_args, env, stderr)`, forked; `pipe_bytes`: its stdout pipe's size, set
        before it can write (a small one holds a training back until the test reads its events)."""
        return TrainingProcess(train_args, env=env, stderr=stderr, start=partial(self._start, pipe_bytes))

    def start_command(self) -> StartCommand:
        """How `TrainingProcess` (or what builds one, such as the planner's step timer) forks its command."""
        return partial(self._start, None)

    def _start(
        self,
        pipe_bytes: int | None,
        argv: list[str],
        env: dict[str, str],
        stderr: IO[str] | None,
        cwd: Path | None,
    ) -> tuple[StartedProcess, IO[str]]:
        with tempfile.TemporaryDirectory(prefix="retrain-warm-training-") as folder:
            stdout = Path(folder, "stdout")
            os.mkfifo(stdout)
            # Opened before the starter opens it to write, which then does not block; switched to blocking
            # reads once the child holds the writing end, so that its end is this stream's end.
            reading = os.open(stdout, os.O_RDONLY | os.O_NONBLOCK)
            try:
                if pipe_bytes is not None:
                    fcntl.fcntl(reading, fcntl.F_SETPIPE_SZ, pipe_bytes)
                errors = Path(stderr.name) if stderr is not None else Path(os.devnull)
                process = self._launcher.start_warm(argv, cwd or self._cwd, env, stdout, errors)
            except BaseException:
                os.close(reading)
                raise
        if process is None:
            os.close(reading)
            raise RuntimeError(f"the warm starter did not start {argv[:4]} (see the warning above)")
        os.set_blocking(reading, True)
        return process, open(reading, encoding="utf-8")  # the TrainingProcess's to read and close

    def start(self, argv: Sequence[str], env: dict[str, str], log: Path) -> StartedProcess:
        """`argv` (`python -m` with this interpreter) forked in this process's folder, its stdout and stderr
        appended to `log`."""
        process = self._launcher.start_warm(argv, self._cwd, env, log, log)
        if process is None:
            raise RuntimeError(f"the warm starter did not start {list(argv[:4])} (see the warning above)")
        return process

    def run(self, argv: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """`subprocess.run(argv, env=env, capture_output=True, text=True)` in this process's folder, forked
        when it is `python -m` with this interpreter."""
        return self._launcher.run(argv, self._cwd, env, timeout=COMMAND_TIMEOUT_S)

    def close(self) -> None:
        self._launcher.close()
