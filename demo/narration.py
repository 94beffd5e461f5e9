"""The demo's voice: numbered stages, indented lines with the time since the start, and a stream that
indents what the pipeline runner prints."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TextIO

INDENT = "      "


class Narrator:
    def __init__(self, out: TextIO, clock: Callable[[], float]) -> None:
        self.out = out
        self._clock = clock
        self._started = clock()
        self._stage = 0

    def title(self, text: str) -> None:
        self._write(text)

    def stage(self, text: str) -> None:
        self._stage += 1
        self._write(f"\n[{self._stage}] {text}  ({self.elapsed():.0f} s)")

    def line(self, text: str) -> None:
        self._write(f"{INDENT}{text}")

    def elapsed(self) -> float:
        return self._clock() - self._started

    def indented(self) -> TextIO:
        """A stream for progress output (the runner's step lines), shown under the current stage."""
        return _Indented(self)

    def _write(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


class _Indented(io.TextIOBase):
    def __init__(self, narrator: Narrator) -> None:
        self._narrator = narrator

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                self._narrator.line(line)
        return len(text)
