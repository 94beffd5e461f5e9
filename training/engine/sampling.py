"""Data-parallel sampling defined over global sample indices.

Each epoch's order is a permutation drawn from (seed, epoch) alone, and every step consumes the next
`global_batch_size` indices of it, split evenly across ranks. The position inside an epoch is therefore
one integer, the same whatever the world size: resuming needs no replay of batches, and a run can resume
on fewer or more processes at exactly the same global sample.

Randomness inside a step (dropout) is counter-based: each (seed, step, rank) seeds its own stream, so the
RNG state at any step is derivable and needs no saving.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from core.errors import InputError
from training.engine.batch_split import per_rank_batch_size


def _derive_seed(*parts: int) -> int:
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def epoch_permutation(seed: int, epoch: int, dataset_size: int) -> torch.Tensor:
    """The order in which epoch `epoch` visits the data set: a pure function of (seed, epoch, size)."""
    generator = torch.Generator().manual_seed(_derive_seed(seed, epoch, 0x5A3))
    return torch.randperm(dataset_size, generator=generator)


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of the random stream rank `rank` uses during global step `step`."""
    return _derive_seed(seed, step, rank, 0xD20)


def seed_step(seed: int, step: int, rank: int, device: torch.device) -> None:
    """Seed the streams rank `rank` draws from during global step `step`: the CPU generator, and on an
    accelerator every generator, as torch.manual_seed does. Training on the CPU seeds the CPU generator
    alone: there torch.manual_seed also queues a lazy seeding of CUDA, XPU and MTIA, each with a formatted
    stack (0.4 ms a step, more than a small model's step takes)."""
    value = step_seed(seed, step, rank)
    if device.type == "cpu":
        torch.random.default_generator.manual_seed(value)
    else:
        torch.manual_seed(value)


@dataclass(frozen=True)
class BatchPlan:
    """How a data set of `dataset_size` samples is cut into global batches.

    The last incomplete batch of an epoch is dropped (each epoch reshuffles, so no sample is dropped
    every time), which keeps every step's global batch, and hence the gradient, the same size.
    """

    dataset_size: int
    global_batch_size: int

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise InputError(f"--global-batch-size {self.global_batch_size}: expected a positive integer")
        if self.dataset_size < self.global_batch_size:
            raise InputError(
                f"--global-batch-size {self.global_batch_size} is larger than the training split "
                f"({self.dataset_size} rows); use a batch size of at most {self.dataset_size}"
            )

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_size // self.global_batch_size

    def per_rank_batch_size(self, world_size: int) -> int:
        return per_rank_batch_size(self.global_batch_size, world_size)


@dataclass(frozen=True)
class DataCursor:
    """Where training stands in the data: the epoch, and how many samples of it are consumed."""

    epoch: int = 0
    position: int = 0

    def advance(self, plan: BatchPlan) -> DataCursor:
        position = self.position + plan.global_batch_size
        if position + plan.global_batch_size > plan.dataset_size:
            return DataCursor(epoch=self.epoch + 1, position=0)
        return DataCursor(epoch=self.epoch, position=position)


def rank_batch_indices(
    permutation: torch.Tensor, cursor: DataCursor, plan: BatchPlan, rank: int, world_size: int
) -> torch.Tensor:
    """The sample indices rank `rank` trains on at `cursor`: its contiguous share of the global batch."""
    per_rank = plan.per_rank_batch_size(world_size)
    start = cursor.position + rank * per_rank
    return permutation[start : start + per_rank]
