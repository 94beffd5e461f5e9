"""How a global batch splits across data-parallel ranks: torch-free, so that the launcher can refuse an
uneven split before it starts any process."""

from __future__ import annotations

from core.errors import InputError


def per_rank_batch_size(global_batch_size: int, world_size: int) -> int:
    """Each rank's share of the global batch; the global batch must split evenly."""
    if global_batch_size % world_size:
        raise InputError(
            f"--global-batch-size {global_batch_size} is not divisible by {world_size} processes; "
            f"choose a multiple of {world_size}"
        )
    return global_batch_size // world_size
