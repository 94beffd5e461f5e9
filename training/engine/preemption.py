"""The eviction notice: SIGTERM means "save now and leave" (and so does a first Ctrl-C, and the death of
the process that started this one: parent_watch.py).

Low-priority nodes are reclaimed with about 30 seconds' notice; torchrun forwards SIGTERM to its workers
and sends SIGKILL after its shutdown timeout (30 s). The handler only raises a flag: the training loop
finishes its current step, agrees with the other ranks on the step to save, saves, and exits with
`PREEMPTED_EXIT_CODE`.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

# EX_TEMPFAIL from sysexits.h: "temporary failure; the user is invited to retry". The run is resumable.
PREEMPTED_EXIT_CODE = 75

# torchrun gives each worker this file (under its --log-dir: <run>/attempt_<n>/<local rank>/error.json) for
# reporting why it failed. torchrun's own exit code is 1 for any worker failure, and when torchrun itself is
# signalled (an eviction signals every process) it reports only its own SignalException; the workers' files
# are how a launcher above torchrun learns that they were preempted.
ELASTIC_ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"

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
        self._previous_handlers: dict[int, object] = {}

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
    path = environ.get(ELASTIC_ERROR_FILE_VARIABLE)
    if not path:
        return
    report = {
        "message": {
            "message": "Preempted: the eviction notice was honoured and the state saved; start again",
            "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time()))},
            "errorCode": PREEMPTED_EXIT_CODE,
        }
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report))
