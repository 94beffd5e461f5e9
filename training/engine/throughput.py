"""Steady-state training throughput, as the trainer reports it and the benchmark compares it."""

from __future__ import annotations

import time
from collections.abc import Callable


class ThroughputMeter:
    """Samples per second between the end of a short warm-up and the latest step.

    Start-up (first steps, allocations) and what follows the last step (final save, evaluation) are not
    throughput, so neither is counted.
    """

    def __init__(self, warmup_steps: int = 3, clock: Callable[[], float] = time.perf_counter) -> None:
        self._warmup_steps = warmup_steps
        self._clock = clock
        self._steps = 0
        self._samples = 0
        self._started: float | None = None
        self._latest: float | None = None

    def update(self, samples: int) -> None:
        self._steps += 1
        self._latest = self._clock()
        if self._steps == self._warmup_steps:
            self._started = self._latest
        elif self._steps > self._warmup_steps:
            self._samples += samples

    @property
    def measured_steps(self) -> int:
        return max(0, self._steps - self._warmup_steps)

    def samples_per_second(self) -> float:
        if self._started is None or self._latest is None or not self._samples:
            return 0.0
        return self._samples / max(self._latest - self._started, 1e-9)
