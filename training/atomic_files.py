"""Files that appear whole: written through a temporary sibling and a rename. Torch-free, so that steps
which never train (the drift check) can use it without paying for the import."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def write_atomically(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Write a file through a temporary sibling and a rename, so readers see all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
