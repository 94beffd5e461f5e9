"""The checkpoint store protocol: a flat namespace of immutable objects.

Two stores implement it: a local folder (`LocalCheckpointStore`) and an Azure Blob Storage container
prefix (`training.checkpoint.blob_store.BlobCheckpointStore`). Everything above this seam (checksums,
commit records, pruning, resume) is written once against the protocol.
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol, runtime_checkable

from core.errors import CheckpointError, RetrainError
from core.secrets import mask_secrets

_OBJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


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


def is_object_name(name: str) -> bool:
    """Whether `name` is one a store may hold (`check_object_name` accepts it): what listings keep."""
    try:
        check_object_name(name)
    except CheckpointError:
        return False
    return True


@runtime_checkable
class CheckpointStore(Protocol):
    """Durable storage for checkpoint objects.

    Guarantees every implementation gives (and `tests/training/checkpoint/test_checkpoint_store.py` checks):
    - `writer(name)` makes the object visible under `name` only when the `with` block exits cleanly; if the
      block raises, or the process dies inside it, no object of that name becomes visible.
    - An existing name is never overwritten: `writer` raises `ObjectExistsError` (at the latest on exit).
    - `names()` lists only complete, visible objects; `read` of anything else raises `ObjectNotFoundError`.
    - A failed write leaves nothing behind that takes space: a local temp file is removed when the block
      raises (a crash's leftovers go at the next `discard_incomplete`), a blob's uncommitted blocks are
      invisible and expire.
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

    def free_bytes(self) -> int | None:
        """Bytes new objects may still take here, or None where the storage has no limit to read (Blob)."""
        ...


def storage_failure(error: BaseException, location: str | None = None) -> str:
    """Why a storage operation on `location` failed, for one line, secrets masked.

    An `OSError` behind the failure gives the operating system's reason and the location ("no space left
    on device on /mnt/ckpt"). torch reports a failed write of its own only as `[enforce fail at
    inline_container.cc:...] unexpected pos`, so the checkpointer keeps the `OSError` its file raised and
    raises that instead. A store's own `CheckpointError` is already one line naming the location and the
    fix; anything else gives its first line.
    """
    if not isinstance(error, RetrainError):
        cause: BaseException | None = error
        while cause is not None:
            if isinstance(cause, OSError) and cause.strerror:
                reason = f"{cause.strerror[:1].lower()}{cause.strerror[1:]}"
                return mask_secrets(f"{reason} on {location}" if location else reason)
            cause = cause.__cause__ or cause.__context__
    lines = str(error).strip().splitlines()
    return mask_secrets(lines[0] if lines else type(error).__name__)[:400]
