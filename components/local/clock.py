"""Time for the runner: wall-clock timestamps for records, a monotonic clock for durations."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> str:
        """The current time, ISO 8601 in UTC."""
        ...

    def monotonic(self) -> float: ...


class SystemClock:
    def now(self) -> str:
        return datetime.now(UTC).isoformat(timespec="milliseconds")

    def monotonic(self) -> float:
        return time.monotonic()
