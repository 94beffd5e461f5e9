"""The eviction notice: SIGTERM means "save now and leave" (and so does a first Ctrl-C, and the death of
the process that started this one: parent_watch.py).

Low-priority nodes are reclaimed with about 30 seconds' notice; torchrun forwards SIGTERM to its workers
and sends SIGKILL after its shutdown timeout (30 s). The handler only raises a flag: the training loop
finishes its current step, agrees with the other ranks on the step to save, saves, and exits with
`PREEMPTED_EXIT_CODE`.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from training.engine.failure_report import ELASTIC_ERROR_FILE_VARIABLE, report_to_launcher

# What signal.signal returns and takes: a handler, SIG_DFL/SIG_IGN, or None for one not set from Python.
SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

__all__ = [
    "ELASTIC_ERROR_FILE_VARIABLE",
    "LAUNCH_ID_VARIABLE",
    "PREEMPTED_EXIT_CODE",
    "PreemptionNotice",
    "report_preemption_to_launcher",
]

log = logging.getLogger(__name__)

# EX_TEMPFAIL from sysexits.h: "temporary failure; the user is invited to retry". The run is resumable.
PREEMPTED_EXIT_CODE = 75

# torchrun exits 1 for any worker failure, and when it is itself signalled (an eviction signals every
# process) it reports only its own SignalException: the workers' own reports (failure_report.py) are how a
# launcher above torchrun learns that they were preempted.
# The launcher names each launch; a preemption save records it, so the launcher can tell its own
# preemption from an older one when torchrun's exit code says only "failed".
LAUNCH_ID_VARIABLE = "RETRAIN_LAUNCH_ID"


class PreemptionNotice:
    """Records the first stop request: SIGTERM (eviction) or SIGINT (Ctrl-C).

    Repeated SIGTERMs change nothing (the OS and torchrun may both send one). A second SIGINT means the
    person at the keyboard will not wait for the save: it aborts at once, as Ctrl-C normally does.
    """

    _SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received_at: float | None = None
        self._previous_handlers: dict[int, SignalHandler] = {}

    @property
    def received(self) -> bool:
        return self.received_at is not None

    def install(self) -> PreemptionNotice:
        for signum in self._SIGNALS:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def uninstall(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    def request(self, reason: str) -> None:
        """Stop as if evicted, for `reason` (the parent's death, say: parent_watch.py). Any thread may ask."""
        if self.received_at is None:
            self.received_at = time.monotonic()
            log.warning("%s: saving after the current step", reason)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is None:
            self.request(f"{signal.Signals(signum).name} received")
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt


def report_preemption_to_launcher(environ: Mapping[str, str]) -> None:
    """Tell torchrun (and whoever reads its error file) that this worker stopped because it was preempted."""
    report_to_launcher(
        environ,
        "Preempted: the eviction notice was honoured and the state saved; start again",
        PREEMPTED_EXIT_CODE,
    )
