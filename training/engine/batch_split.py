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


def micro_batch_size(global_batch_size: int, world_size: int, accumulate_grad_batches: int) -> int:
    """Each micro-batch's size when each rank reaches its share in `accumulate_grad_batches` equal parts:
    equal, so that the mean of the micro-batches' mean losses is the share's mean loss."""
    per_rank = per_rank_batch_size(global_batch_size, world_size)
    if per_rank % accumulate_grad_batches:
        raise InputError(
            f"--accumulate-grad-batches {accumulate_grad_batches}: each of {world_size} processes trains "
            f"{per_rank} samples a step (--global-batch-size {global_batch_size}), which do not split into "
            f"{accumulate_grad_batches} equal micro-batches; choose a --global-batch-size that is a multiple "
            f"of {world_size * accumulate_grad_batches}"
        )
    return per_rank // accumulate_grad_batches
