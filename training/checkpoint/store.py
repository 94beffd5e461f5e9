"""The checkpoint store protocol: a flat namespace of immutable objects.

Two stores implement it: a local folder (`LocalCheckpointStore`) and an Azure Blob Storage container
prefix (`training.checkpoint.blob_store.BlobCheckpointStore`). Everything above this seam (checksums,
commit records, pruning, resume) is written once against the protocol.
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol, runtime_checkable

from training.errors import CheckpointError

_OBJECT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class ObjectExistsError(CheckpointError):
    """An object of that name exists already; objects are never overwritten in place."""


class ObjectNotFoundError(CheckpointError):
    """No visible object of that name."""


def check_object_name(name: str) -> str:
    """Return `name` if it is a plain object name (no folders, no path tricks), else raise."""
    if not _OBJECT_NAME.fullmatch(name):
        raise CheckpointError(
            f"checkpoint object name {name!r} is not allowed; expected letters, digits, '.', '_' or '-' "
            "(no '/' and not starting with '.'), at most 200 characters"
        )
    return name


@runtime_checkable
class CheckpointStore(Protocol):
    """Durable storage for checkpoint objects.

    Guarantees every implementation gives (and `tests/training/test_checkpoint_store.py` checks):
    - `writer(name)` makes the object visible under `name` only when the `with` block exits cleanly; if the
      block raises, or the process dies inside it, no object of that name becomes visible.
    - An existing name is never overwritten: `writer` raises `ObjectExistsError` (at the latest on exit).
    - `names()` lists only complete, visible objects; `read` of anything else raises `ObjectNotFoundError`.
    """

    @property
    def location(self) -> str:
        """Where the store points, for logs and messages; never contains a secret."""
        ...

    def writer(self, name: str) -> AbstractContextManager[BinaryIO]:
        """A binary file to write the object into; it becomes visible atomically on a clean exit."""
        ...

    def read(self, name: str) -> bytes:
        """The object's bytes."""
        ...

    def names(self) -> list[str]:
        """The names of all visible objects, sorted."""
        ...

    def delete(self, name: str) -> None:
        """Remove an object; removing one that is already gone is not an error."""
        ...

    def discard_incomplete(self) -> int:
        """Remove leftovers of writes that never completed (a crash mid-write); returns how many."""
        ...
