"""A running starter (training/warm/starter.py, named here by module: components never imports training),
and which steps it can fork: those run in its folder with its interpreter settings. The launcher that uses
it is warm.py; where idle ones wait between runs, starter_pool.py. `retrain` starts one before its own
imports (retrain_cli.warm_start_ahead), so this module imports little.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Mapping
from pathlib import Path

STARTER_MODULE = "training.warm.starter"


def _interpreter_settings(env: Mapping[str, str]) -> dict[str, str]:
    """What decides how an interpreter starts and where it imports from: a step differing here is cold."""
    return {name: value for name, value in env.items() if name.startswith("PYTHON")}


class StarterProcess:
    """A running starter, and the steps it can fork: those run in `cwd` with its interpreter settings."""

    def __init__(self, process: subprocess.Popen[bytes], cwd: Path, env: Mapping[str, str]) -> None:
        self.process = process
        self.cwd = Path(cwd).resolve()
        self.settings = _interpreter_settings(env)

    @classmethod
    def start(cls, python: str, cwd: Path, env: Mapping[str, str]) -> StarterProcess:
        """Start one for steps run in `cwd` with `env`; OSError if it cannot be started."""
        # Its stderr is the runner's: it speaks only of a problem (a module it could not preload).
        process = subprocess.Popen(
            [python, "-m", STARTER_MODULE],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C is the runner's to forward, to the step alone
        )
        return cls(process, cwd, env)

    def serves(self, cwd: Path, env: Mapping[str, str]) -> bool:
        return Path(cwd).resolve() == self.cwd and _interpreter_settings(env) == self.settings

    def close(self) -> None:
        """Killed, not asked: it may still be importing (a run whose steps were all cached), and it holds
        nothing to save. Closing it again does nothing."""
        if self.process.returncode is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # a request still buffered for a starter that had died
                    stream.close()
