"""The eviction notice: SIGTERM means "save now and leave" (and so does a first Ctrl-C).

Low-priority nodes are reclaimed with about 30 seconds' notice; torchrun forwards SIGTERM to its workers
and sends SIGKILL after its shutdown timeout (30 s). The handler only raises a flag: the training loop
finishes its current step, agrees with the other ranks on the step to save, saves, and exits with
`PREEMPTED_EXIT_CODE`.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

log = logging.getLogger(__name__)

# EX_TEMPFAIL from sysexits.h: "temporary failure; the user is invited to retry". The run is resumable.
PREEMPTED_EXIT_CODE = 75


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

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
            log.warning("%s received: saving after the current step", signal.Signals(signum).name)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
