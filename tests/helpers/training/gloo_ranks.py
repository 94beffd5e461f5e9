"""Run a function on N processes that form a gloo process group, as torchrun's workers do, for tests of the
collectives under the engine (a sharded save's) without a whole training. Each rank is a spawned process
(a fresh interpreter: a fork would inherit the test process's threads); an assertion failing on any rank
fails the call, with that rank's traceback."""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
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


def start_on_ranks(
    world_size: int, folder: Path, work: Callable[..., None], *args: Any
) -> list[multiprocessing.process.BaseProcess]:
    """As `run_on_ranks`, but returns the started processes (rank order) for the caller to join: for tests
    in which a rank dies (and the others cannot end together)."""
    rendezvous = str(folder / "rendezvous")
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_rank, args=(rank, world_size, rendezvous, work, args))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    return processes


def run_on_ranks(world_size: int, folder: Path, work: Callable[..., None], *args: Any) -> None:
    """`work(rank, world_size, *args)` on every rank of a new gloo group; `work` must be importable (a
    module-level function), and so must its arguments be picklable."""
    rendezvous = str(folder / "rendezvous")
    mp.start_processes(
        _rank, args=(world_size, rendezvous, work, args), nprocs=world_size, start_method="spawn"
    )
