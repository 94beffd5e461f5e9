"""Why a worker stopped, told to whatever started torchrun, through torchelastic's error file.

torchrun gives each worker a file to report its failure in (TORCHELASTIC_ERROR_FILE; under its --log-dir:
<run>/attempt_<n>/<local rank>/error.json) and copies the first failed worker's report into its own error
file, with that worker's exit code as `errorCode`. torchrun itself only says "failed with exit code 1" and
raises ChildFailedError, so this report is how a launcher above it (`retrain train --nproc N`,
training/engine/launch.py; the local runner, components/local/launch.py) learns the worker's own one-line
reason: a divergence (65), a preemption (75), a bad input or task (2), or a crash (1, with its traceback kept
in the report's `py_callstack`, torchelastic's own place for it, never on the user's screen).

Nothing here imports torch: the launcher reads the report without paying for it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import RetrainError

ELASTIC_ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"


@dataclass(frozen=True)
class WorkerReport:
    """A report read back: the failed worker's exit code (None when torchrun wrote its own exception), its
    one-line reason, and a traceback when it crashed."""

    code: int | None
    message: str
    callstack: str = ""


class WorkerFailed(RetrainError):
    """A worker under torchrun failed and said why: `retrain train` prints its line and exits with its
    code, as the worker itself would have without torchrun between them."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def report_to_launcher(environ: Mapping[str, str], message: str, code: int, callstack: str = "") -> None:
    """Write this worker's reason (one line) and exit code into its error file, if torchrun gave it one."""
    path = environ.get(ELASTIC_ERROR_FILE_VARIABLE)
    if not path:
        return
    report = {
        "message": {
            "message": " ".join(message.split()),
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))},
            "errorCode": code,
        }
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report))


def read_report(error_file: Path) -> WorkerReport | None:
    """The report in a torchelastic error file; None when there is none, or it says nothing usable."""
    try:
        message = json.loads(error_file.read_text())["message"]
        text = message["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(text, str) or not text.strip():
        return None
    code = message.get("errorCode")
    extra = message.get("extraInfo")
    callstack = extra.get("py_callstack") if isinstance(extra, dict) else ""
    return WorkerReport(
        code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        message=text.strip().splitlines()[0],
        callstack=callstack if isinstance(callstack, str) else "",
    )
