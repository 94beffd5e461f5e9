"""How a printed hint invokes this installation's Python and `retrain`, so that it runs as printed.

A bare `python` or `retrain` is often not on PATH (a virtual environment that is not activated, a system
with only `python3`), or is another installation's. A hint therefore names this very interpreter by path,
and the `retrain` script installed beside it (`.venv/bin/retrain`, as the README writes it), else this
interpreter running the command's module. A path under the working folder is shown relative to it: it
has a slash, so a shell runs it as it is instead of searching PATH.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

RETRAIN_SCRIPT = "retrain"  # pyproject.toml's [project.scripts]
RETRAIN_MODULE = "retrain_cli"


def shown_path(path: Path, cwd: Path) -> str:
    """`path` relative to `cwd` when under it, else absolute. Never resolved: a virtual environment's
    interpreter is a link, and resolving it would leave the environment."""
    absolute = Path(os.path.abspath(path))
    return str(absolute.relative_to(cwd)) if absolute.is_relative_to(cwd) else str(absolute)


def python_argv(cwd: Path, executable: str = sys.executable) -> list[str]:
    """This interpreter, as a shell in `cwd` starts it."""
    return [shown_path(Path(executable), cwd)]


def retrain_argv(cwd: Path, executable: str = sys.executable) -> list[str]:
    """`retrain`, as a shell in `cwd` starts this installation's: the script beside the interpreter,
    else the interpreter running the command's module."""
    script = Path(executable).parent / RETRAIN_SCRIPT
    if script.is_file() and os.access(script, os.X_OK):
        return [shown_path(script, cwd)]
    return [*python_argv(cwd, executable), "-m", RETRAIN_MODULE]


def command_line(argv: Sequence[str]) -> str:
    """One command line a POSIX shell splits back into `argv`."""
    return shlex.join(argv)
