"""The process group: torchrun's environment in, a small context out.

Under torchrun (or Azure ML's PyTorch launcher) RANK, WORLD_SIZE and LOCAL_RANK are set and the
process joins a group: NCCL when it has a GPU, gloo on CPU. Without them it is a single process and no
group is created, so the same trainer runs both ways.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from core.errors import InputError

log = logging.getLogger(__name__)

_COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _select_device(preference: str, local_rank: int) -> torch.device:
    if preference not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device {preference!r}: expected one of auto, cpu, cuda")
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available here; use --device cpu or auto")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_distributed(device_preference: str, environ: Mapping[str, str] = os.environ) -> DistContext:
    world_size = int(environ.get("WORLD_SIZE", "1"))
    rank = int(environ.get("RANK", "0"))
    local_rank = int(environ.get("LOCAL_RANK", "0"))
    device = _select_device(device_preference, local_rank)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=_COLLECTIVE_TIMEOUT)
        log.debug("rank %d/%d joined the %s process group", rank, world_size, backend)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_from_primary(value: object, context: DistContext) -> object:
    """Rank 0's value on every rank."""
    if not context.is_distributed:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0, device=context.device)
    return holder[0]


def barrier(context: DistContext) -> None:
    if context.is_distributed:
        dist.barrier()
