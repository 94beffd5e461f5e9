"""Which of the steps' own source files the starter has imported, and whether any has changed since.

A forked step runs the code its starter imported, not the code on disk. A starter kept from one run to the
next (components/local/starter_pool.py) would, after an edit, fork the old engine into a run whose cache
key and code hash say the new one; and even within one run, a step forked after an edit would. So before
each fork the starter compares the files it imported from the steps' folder with what it read, and refuses
to fork a step from changed code. Installed packages are not the run's code (a virtual environment inside
the folder included), and the user's task is never preloaded.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from core.sources import INSTALLED_FOLDERS


class LoadedSources:
    """The signature (mtime, size) of each source file under `folder` imported so far."""

    def __init__(self, folder: Path) -> None:
        self._folder = Path(folder).resolve()
        self._signatures: dict[str, tuple[int, int]] = {}
        self._looked_at: set[str] = set()  # every module name seen, so each is judged once

    def note(self) -> None:
        """Take the signatures of the files of modules imported since the last call."""
        for name, module in list(sys.modules.items()):
            if name in self._looked_at:
                continue
            self._looked_at.add(name)
            file = getattr(module, "__file__", None)
            if not file:
                continue
            path = Path(file).resolve()
            if not path.is_relative_to(self._folder):
                continue
            if INSTALLED_FOLDERS.intersection(path.relative_to(self._folder).parts):
                continue
            try:
                signature = os.stat(path)
            except OSError:
                continue  # imported from a file gone already: nothing to compare with
            self._signatures[str(path)] = (signature.st_mtime_ns, signature.st_size)

    def changed(self) -> str | None:
        """The first imported file that has changed or gone since it was imported, relative to the folder;
        None if none has."""
        for file, signature in self._signatures.items():
            try:
                now = os.stat(file)
            except OSError:
                return os.path.relpath(file, self._folder)
            if (now.st_mtime_ns, now.st_size) != signature:
                return os.path.relpath(file, self._folder)
        return None
