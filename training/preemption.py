"""The eviction notice: SIGTERM means "save now and leave".

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
    """Records the first SIGTERM; later ones (the OS and torchrun may both send one) change nothing."""

    def __init__(self) -> None:
        self.received_at: float | None = None
        self._previous_handler: signal.Handlers | None = None

    @property
    def received(self) -> bool:
        return self.received_at is not None

    def install(self) -> PreemptionNotice:
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def uninstall(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
            log.warning("eviction notice (SIGTERM): saving after the current step")
