"""Before training: can this location take checkpoints at all? A write test and a free-space check.

A run whose checkpoints cannot be written trains for nothing if it is evicted, so a location that fails
either check is refused in one line before the first step (exit 2, nothing trained):

- **Writable**: a probe object is written (and, locally, fsynced), then deleted. This catches a read-only
  folder or mount, missing permissions, a SAS token without write or delete rights, and a file system
  without hard links (the local store publishes with `os.link`).
- **Room**: the free space must hold `slots_needed` checkpoints of the expected size. A save writes the
  new checkpoint before it prunes the oldest, so keeping N needs room for N + 1; the checkpoints already
  there count towards that, and the need is never below two. Blob Storage has no quota a client can read:
  there only writability is checked (and said so in the log).

Nothing here imports torch: the launcher runs it before it starts torchrun.
"""

from __future__ import annotations

import logging
import secrets
from contextlib import suppress

from core.errors import CheckpointError
from core.secrets import mask_secrets
from training.checkpoint.records import committed_checkpoints
from training.checkpoint.store_protocol import CheckpointStore, storage_failure

log = logging.getLogger(__name__)

MIN_CHECKPOINTS_OF_ROOM = 2
PROBE_PREFIX = "retrain-probe-"
_PROBE_PAYLOAD = b"retrain: a test write before training; deleted at once\n"


def slots_needed(keep_last: int, committed: int) -> int:
    """Checkpoints' worth of free space a run needs: its kept ones plus the one being written, less those
    already there, and at least `MIN_CHECKPOINTS_OF_ROOM`."""
    return max(MIN_CHECKPOINTS_OF_ROOM, keep_last + 1 - min(committed, keep_last))


def megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size < 10**9 else f"{size / 1e9:.2f} GB"


def check_writable(store: CheckpointStore) -> None:
    """Write, sync and delete a probe object; refuse the location in one line if any of it fails."""
    for leftover in [name for name in store.names() if name.startswith(PROBE_PREFIX)]:
        with suppress(CheckpointError, OSError):  # a probe of a run that died between write and delete
            store.delete(leftover)
    probe = f"{PROBE_PREFIX}{secrets.token_hex(8)}"
    try:
        with store.writer(probe) as target:
            target.write(_PROBE_PAYLOAD)
        store.delete(probe)
    except CheckpointError as error:  # the store's own line names the location and the fix
        raise CheckpointError(mask_secrets(f"a test write before training failed: {error}")) from None
    except OSError as error:
        raise CheckpointError(
            f"checkpoint location {mask_secrets(store.location)} failed a test write before training: "
            f"{storage_failure(error)}; expected a location this process can write and delete in "
            "(make it writable, or pass another --checkpoints)"
        ) from None


def check_room(store: CheckpointStore, checkpoint_bytes: int, basis: str, keep_last: int) -> None:
    """Refuse the location unless it is writable and has room for the checkpoints the run will keep.

    `checkpoint_bytes`: the expected size of one checkpoint; `basis` says where it comes from, for the
    message ("the size of step-...", "estimated from the model and optimizer").
    """
    check_writable(store)
    free = store.free_bytes()
    if free is None:
        log.info(
            "checkpoint location %s is writable; its free space cannot be read (Blob Storage has no quota "
            "to read), so only writability was checked",
            store.location,
        )
        return
    slots = slots_needed(keep_last, len(committed_checkpoints(store.names())))
    needed = slots * checkpoint_bytes
    if free < needed:
        location = mask_secrets(store.location)
        raise CheckpointError(
            f"checkpoint location {location} has {megabytes(free)} free; expected room for "
            f"{slots} checkpoints of about {megabytes(checkpoint_bytes)} each ({megabytes(needed)}; {basis}) "
            "before training starts: free some space there, or pass another --checkpoints"
        )
    log.debug(
        "checkpoint location %s: %s free, %d checkpoint(s) of %s needed", store.location,
        megabytes(free), slots, megabytes(checkpoint_bytes),
    )  # fmt: skip
