"""Run a function on N processes that form a gloo process group, as torchrun's workers do, for tests of the
collectives under the engine (a sharded save's) without a whole training. Each rank is a spawned process
(a fresh interpreter: a fork would inherit the test process's threads); an assertion failing on any rank
fails the call, with that rank's traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world_size: int, rendezvous: str, work: Callable[..., None], args: tuple) -> None:
    store = dist.FileStore(rendezvous, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        work(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_on_ranks(world_size: int, folder: Path, work: Callable[..., None], *args: Any) -> None:
    """`work(rank, world_size, *args)` on every rank of a new gloo group; `work` must be importable (a
    module-level function), and so must its arguments be picklable."""
    rendezvous = str(folder / "rendezvous")
    mp.start_processes(
        _rank, args=(world_size, rendezvous, work, args), nprocs=world_size, start_method="spawn"
    )
