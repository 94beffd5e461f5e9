"""The starter: one interpreter per local run that imports what the steps import, then forks them.

    python -m training.warm.starter      (started by the local runner: components/local/warm.py)

It speaks JSON lines: requests on stdin, answers on stdout; its stderr (the runner's) tells only of a
problem, a module it could not preload.

    → {"id": 1, "module": "training.cli", "args": [...], "cwd": "...", "env": {...},
       "stdout": "FILE", "stderr": "FILE"}      (appended to; the same file for both is one log)
    ← {"ready": PID}                        once, as it starts serving
    ← {"id": 1, "pid": 4242}                the step's process is running (or {"id": 1, "error": "..."};
                                            with "stale": true when the code it imported has changed)
    ← {"pid": 4242, "exit": 0}              it ended, with the code `subprocess.Popen.returncode` gives

Each step is a child of this process (training/warm/forked.py), in a session of its own, its output
appended to its log. The starter is its runner's: when its stdin closes (the runner ended, or died) it
leaves at once, and a torchrun agent it started, which dies with its parent (torchrun_agent.py), goes with
it, so its workers save and leave as when the runner itself was their agent's parent.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from training.warm.forked import ForkedProcess
from training.warm.loaded_sources import LoadedSources
from training.warm.preload import FILLED_CACHES, TRACKING, TRAINING, load

# What the steps import before they do anything, in the order they need it: what the preflight and
# prepare need (torch, pandas, the step commands), then MLflow's tracking and what a training worker needs
# besides (preload.py), then what evaluation and registration need, then caches the steps fill
# (FILLED_CACHES).
# Never the user's task: each step imports that afresh. A step is forked only between two imports, so
# MLflow's (2.5 s) and torch's compiler's (1.7 s) largest dependencies come first, each on its own: no
# single import then holds a waiting step back for more than about 0.7 s.
_MLFLOW_PARTS = (
    "fastapi",
    "azure.storage.blob",
    "scipy.sparse",
    "sqlalchemy.orm",
    "alembic",
    "azureml.mlflow",
)
_COMPILER_PARTS = ("sympy", "torch.fx.experimental.symbolic_shapes")
PRELOAD = (
    "numpy",
    "torch",
    "pandas",
    "training.cli",
    *_MLFLOW_PARTS,
    *TRACKING,
    *_COMPILER_PARTS,
    *TRAINING,
    "mlflow.tracing.processor.base_mlflow",
    "mlflow.pyfunc",
    "training.gate.cli",
    "training.gate.evaluate",
    "training.gate.register",
    *FILLED_CACHES,
)


class Starter:
    """Preloads `modules` one by one, and between two of them starts every step whose own module is
    loaded by then: the preflight and prepare run while MLflow and torch's compiler are still being
    imported, instead of after. A step whose module is not preloaded yet waits for it; one whose module
    is not on the list starts once everything is loaded."""

    def __init__(self, modules: tuple[str, ...] = PRELOAD) -> None:
        self._to_load = list(modules)
        self._children: dict[int, ForkedProcess] = {}
        self._waiting: list[dict[str, Any]] = []  # requests for a module not preloaded yet
        self._pending = b""
        self._importing = False  # only then does SIGCHLD report ended steps itself (_child_ended)
        self._reaping = self._reap_again = False
        self._sources = LoadedSources(Path.cwd())  # the steps' folder: the starter runs in it
        self._sources.note()
        self._wakeup_read, self._wakeup_write = os.pipe()
        os.set_blocking(self._wakeup_read, False)
        os.set_blocking(self._wakeup_write, False)

    def serve(self) -> int:
        signal.set_wakeup_fd(self._wakeup_write)
        signal.signal(signal.SIGCHLD, self._child_ended)  # also writes the wakeup descriptor
        self._send({"ready": os.getpid()})
        with selectors.DefaultSelector() as selector:
            selector.register(0, selectors.EVENT_READ, "requests")
            selector.register(self._wakeup_read, selectors.EVENT_READ, "children")
            while True:
                # Between two imports, only look; once all are in, wait.
                for key, _ in selector.select(timeout=0 if self._to_load or self._waiting else None):
                    if key.data == "children":
                        self._drain_wakeups()
                    elif not self._read_requests():
                        return 0  # the runner has gone: so does its starter
                self._reap()
                self._start_ready()  # before the next import, which may take seconds
                if self._to_load:
                    self._load(self._to_load.pop(0))

    def _child_ended(self, signum: int, frame: object) -> None:
        """SIGCHLD: while an import runs (MLflow's takes seconds), report a step that ended now, not after
        it: the runner is waiting on that step to start the next. Starting steps still waits for the import
        to end, since a child forked in the middle of one would inherit a half-initialised module."""
        if self._importing:
            self._reap()

    def _load(self, name: str) -> None:
        self._importing = True
        try:
            self._reap()  # a step that ended since the loop last looked; from here on, SIGCHLD reports
            load(name)
        finally:
            self._importing = False
        self._sources.note()
        if self._to_load:
            return
        threads = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
        if threads:  # a forked child would inherit none of them: say so, the steps may misbehave
            print(f"warm start: threads running before a fork: {threads}", file=sys.stderr, flush=True)

    def _read_requests(self) -> bool:
        chunk = os.read(0, 65536)
        if not chunk:
            return False
        self._pending += chunk
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            if line.strip():
                self._waiting.append(json.loads(line))
        return True

    def _start_ready(self) -> None:
        still = []
        for request in self._waiting:
            module = request.get("module")
            if module in sys.modules or not self._to_load:
                self._start(request)
            else:
                still.append(request)
        self._waiting = still

    def _start(self, request: dict[str, Any]) -> None:
        changed = self._sources.changed()
        if changed is not None:  # a child would run the code as it was, not as it is
            error = f"{changed} has changed since the starter imported it"
            self._send({"id": request.get("id"), "error": error, "stale": True})
            return
        try:
            with contextlib.ExitStack() as files:
                nothing = files.enter_context(open(os.devnull, "rb"))
                stdout = files.enter_context(open(request["stdout"], "ab"))
                same = request["stderr"] == request["stdout"]
                stderr = stdout if same else files.enter_context(open(request["stderr"], "ab"))
                child = ForkedProcess(
                    request["module"],
                    request["args"],
                    env=request["env"],
                    cwd=request["cwd"],
                    stdin=nothing,
                    stdout=stdout,
                    stderr=stderr,
                )
        except (OSError, KeyError, TypeError) as error:
            self._send({"id": request.get("id"), "error": f"{type(error).__name__}: {error}"})
            return
        self._children[child.pid] = child
        self._send({"id": request.get("id"), "pid": child.pid})

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wakeup_read, 4096):
                pass
        except BlockingIOError:
            return

    def _reap(self) -> None:
        """Report every step that has ended. A SIGCHLD that lands in the middle (its handler calls this
        again) makes the pass run once more, rather than report half-way through this one."""
        if self._reaping:
            self._reap_again = True
            return
        self._reaping = True
        try:
            self._reap_again = True
            while self._reap_again:
                self._reap_again = False
                for pid, child in list(self._children.items()):
                    code = child.poll()
                    if code is not None:
                        del self._children[pid]
                        self._send({"pid": pid, "exit": code})
        finally:
            self._reaping = False

    def _send(self, message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def main() -> int:
    return Starter().serve()


if __name__ == "__main__":
    sys.exit(main())
