"""Start steps warm: forked by a starter that has already imported torch and MLflow.

The starter (training/warm/starter.py, run by starter.py) is started on the run's first step, or before,
when the runner knows the steps' folder and environment (`warm_up`), so that its imports overlap the
runner's own work; `retrain run` starts it earlier still, before its own imports (StarterProcess.start,
handed to the launcher), since the run's steps wait on little else than the starter's imports. A step
whose command is `python -m MODULE ...` with this interpreter, in the starter's folder and with the same
interpreter settings (the PYTHON* variables), is then forked by it; anything else, or every step once the
starter has failed, starts as a fresh process (SubprocessLauncher), which is what a warm start must be
indistinguishable from. A step started either way is its own process in its own session, with its own pid
and log: the runner's signals, restarts and reports are the same for both.

The starter leaves when the runner closes it (the run ended) or dies (its stdin closes); given a pool
(starter_pool.py), the launcher hands it back there, idle, for the process's next run instead. A starter
whose imported code has changed refuses to fork, and is replaced.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.local.launch import ProcessLauncher, StepProcess, SubprocessLauncher
from components.local.starter import StarterProcess
from components.local.starter_pool import StarterPool

log = logging.getLogger(__name__)

_TIMED_OUT: dict[str, Any] = {}  # what `_receive` returns when its time ran out


def _read(path: Path) -> str:
    return path.read_bytes().decode(errors="replace") if path.exists() else ""


class _WarmProcess:
    """A step forked by the starter: its pid, its end as the starter reports it, signals to its group."""

    def __init__(self, pid: int, launcher: WarmLauncher) -> None:
        self._pid = pid
        self._launcher = launcher
        self._code: int | None = None  # once reported: the starter reports an end only once

    @property
    def pid(self) -> int:
        return self._pid

    def poll(self) -> int | None:
        """Its exit code if it has ended, else None, without waiting (as `Popen.poll`)."""
        if self._code is None:
            self._code = self._launcher.exit_code(self._pid, timeout=0.0)
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code once it has ended; `subprocess.TimeoutExpired` if `timeout` seconds pass first."""
        if self._code is None:
            self._code = self._launcher.exit_code(self._pid, timeout)
        if self._code is None:
            raise subprocess.TimeoutExpired(f"pid {self._pid}", timeout or 0.0)
        return self._code

    def send_signal(self, signum: int) -> None:
        try:
            os.killpg(self._pid, signum)  # it leads its own session, as a step started fresh does
        except ProcessLookupError:
            try:
                os.kill(self._pid, signum)  # still becoming the step: not yet its session's leader
            except ProcessLookupError:
                log.debug("step %d ended before signal %d arrived", self._pid, signum)


class WarmLauncher:
    """A ProcessLauncher that forks `python -m` steps from a starter, and starts anything else fresh."""

    def __init__(
        self,
        python: str,
        fallback: ProcessLauncher | None = None,
        starter: StarterProcess | None = None,
        pool: StarterPool | None = None,
    ) -> None:
        """`starter`: one started ahead (StarterProcess.start), now this launcher's to use and close.
        `pool`: where this process keeps idle starters between runs; the launcher takes its starter from
        there if one serves, and hands it back when it closes instead of ending it."""
        self._python = python
        self._fallback = fallback or SubprocessLauncher()
        self._starter = starter
        self._pool = pool
        self._failed = False
        self._next_id = 0
        self._running: set[int] = set()  # steps forked by the starter whose end it has not reported yet
        self._ended: dict[int, int] = {}
        self._pending = b""  # the starter's output read but not yet split into messages

    def warm_up(self, cwd: Path, env: Mapping[str, str]) -> None:
        """Have a starter now, for steps run in `cwd` with `env`'s interpreter settings."""
        if self._failed:
            return
        if self._starter is not None:
            if self._running or self._starter.serves(cwd, env):
                return
            self._release_starter()  # one for another folder or interpreter, with no step of its own running
        kept = self._pool.take(self._python, cwd, env) if self._pool is not None else None
        if kept is not None:
            self._starter = kept
            return
        try:
            self._starter = StarterProcess.start(self._python, cwd, env)
        except OSError as error:
            self._give_up(f"could not start the starter ({error})")

    def start(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], log_file: Path) -> StepProcess:
        process = self.start_warm(argv, cwd, env, log_file, log_file)
        return process if process is not None else self._fallback.start(argv, cwd, env, log_file)

    def run(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """`subprocess.run(argv, capture_output=True, text=True, timeout=timeout)`, started warm if it can
        be; TimeoutExpired after killing its process group when it runs out of time."""
        with tempfile.TemporaryDirectory(prefix="retrain-warm-") as folder:
            stdout, stderr = Path(folder, "stdout"), Path(folder, "stderr")
            process = self.start_warm(argv, cwd, env, stdout, stderr)
            if process is None:
                return subprocess.run(
                    list(argv),
                    cwd=cwd,
                    env=dict(env),
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    check=False,
                )
            code = self.exit_code(process.pid, timeout)
            if code is None:
                process.send_signal(signal.SIGKILL)
                process.wait()
                raise subprocess.TimeoutExpired(list(argv), timeout)
            return subprocess.CompletedProcess(list(argv), code, _read(stdout), _read(stderr))

    def start_warm(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], stdout: Path, stderr: Path
    ) -> _WarmProcess | None:
        """The command forked by the starter, its output appended to `stdout` and `stderr` (one path for
        both: one log; a FIFO the caller reads is opened before this returns); None when it must start
        fresh (not `python -m`, another folder or interpreter settings, or no starter)."""
        module = self._module_command(argv)
        if module is None or self._failed:
            return None
        for _ in range(2):  # a starter whose code changed is replaced once
            self.warm_up(cwd, env)
            if self._starter is None or not self._starter.serves(cwd, env):
                return None
            self._next_id += 1
            request = {"id": self._next_id, "module": module[0], "args": module[1], "cwd": str(cwd),
                       "env": dict(env), "stdout": str(stdout), "stderr": str(stderr)}  # fmt: skip
            answer = self._ask(request)
            if answer is not None and "pid" in answer:
                self._running.add(int(answer["pid"]))
                return _WarmProcess(int(answer["pid"]), self)
            if answer is None or not answer.get("stale"):
                self._give_up(
                    f"it did not start {module[0]}: {answer.get('error') if answer else 'it has ended'}"
                )
                return None
            log.info("warm start: %s; a new starter imports it afresh", answer.get("error"))
            if self._running:  # its other steps still run, and end with it: this one starts fresh
                return None
            self._end_starter()
        return None

    def exit_code(self, pid: int, timeout: float | None = None) -> int | None:
        """Wait for the starter to report `pid`'s end; None if `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self._ended:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            message = self._receive(left)
            if message is _TIMED_OUT:
                return None
            if message is None:  # the starter is gone, and with it what it knew: end the step too
                self._give_up("it ended while a step ran")
                _WarmProcess(pid, self).send_signal(signal.SIGKILL)
                return -signal.SIGKILL
        return self._ended.pop(pid)

    def close(self) -> None:
        """The run is over, and every step it started has ended: hand the starter back to the pool, if
        there is one and the starter is idle and well, else end it."""
        self._ended.clear()  # none of the run's steps is waited on any more
        self._release_starter()

    def _release_starter(self) -> None:
        starter, pending = self._starter, self._pending
        idle = not self._running and not pending and not self._failed
        if starter is not None and self._pool is not None and idle and starter.process.poll() is None:
            self._forget_starter()
            self._pool.give_back(self._python, starter)
            return
        self._end_starter()

    def _end_starter(self) -> None:
        starter = self._starter
        self._forget_starter()
        if starter is not None:
            starter.close()

    def _forget_starter(self) -> None:
        """Drop what was the starter's. The ends it reported stay: a step of this run that ended before
        its starter was replaced is still waited on."""
        self._starter = None
        self._running.clear()
        self._next_id, self._pending = 0, b""

    def _module_command(self, argv: Sequence[str]) -> tuple[str, list[str]] | None:
        if len(argv) < 3 or argv[0] != self._python or argv[1] != "-m" or argv[2].startswith("-"):
            return None
        return argv[2], list(argv[3:])

    def _ask(self, request: dict[str, Any]) -> dict[str, Any] | None:
        starter = self._starter.process if self._starter is not None else None
        if starter is None or starter.stdin is None:
            return None
        try:
            starter.stdin.write(json.dumps(request).encode() + b"\n")
            starter.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        while True:
            message = self._receive()
            if message is None or message.get("id") == request["id"]:
                return message

    def _receive(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The starter's next message (an exit report is also kept); None once it has ended, `_TIMED_OUT`
        when `timeout` seconds pass first."""
        starter = self._starter.process if self._starter is not None else None
        if starter is None or starter.stdout is None:
            return None
        descriptor = starter.stdout.fileno()
        while b"\n" not in self._pending:
            ready, _, _ = select.select([descriptor], [], [], timeout)
            if not ready:
                return _TIMED_OUT
            chunk = os.read(descriptor, 65536)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        message = json.loads(line)
        if "exit" in message:
            self._ended[int(message["pid"])] = int(message["exit"])
            self._running.discard(int(message["pid"]))
        return message

    def _give_up(self, why: str) -> None:
        if not self._failed:
            log.warning("warm start: %s; steps start as fresh processes", why)
        self._failed = True
