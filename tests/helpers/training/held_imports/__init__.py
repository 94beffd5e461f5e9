"""Modules a test's warm starter preloads, each held at its import until the test lets it go: it reads a
line from the FIFO named by $HELD_IMPORT_<NAME>. Run as a step (`python -m`), a module ends at once, with
code 5, so that a test can tell its end report from any other."""

from __future__ import annotations

import os
import sys

STEP_EXIT_CODE = 5


def hold_or_end(module: str) -> None:
    if module == "__main__":
        sys.exit(STEP_EXIT_CODE)
    name = module.rsplit(".", 1)[-1].upper()
    with open(os.environ[f"HELD_IMPORT_{name}"]) as gate:
        gate.readline()
