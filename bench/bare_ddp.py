"""The baseline: a bare hand-written DDP or FSDP loop, no checkpoints, nothing but training.

    torchrun --standalone --nproc-per-node=N bench/bare_ddp.py --task REF --task-options JSON \
        --data D --steps S --global-batch-size B [--strategy ddp|fsdp]

Same task as our trainer (so the same data, model, loss), the same optimizer and the same batches: a
gather of the split by a tensor of indices when it takes one, else `default_collate` over its samples. The
difference `bench/trainer.py` measures is the trainer's own machinery (sampling, the per-step rank
agreement, progress, tracking and checkpoints). Rank 0 prints one JSON line with samples/s over the steps
after the same warm-up our trainer skips.

`--strategy ddp` (the default) wraps the model in DistributedDataParallel. `--strategy fsdp` shards it as
`retrain train --strategy fsdp` does (training/engine/strategy.py): PyTorch's `fully_shard` (FSDP2) over a
one-dimensional CPU mesh of all ranks, on the same units (`task_units`: the task's `fsdp_modules` hook, or
`default_units`), then the root; AdamW is built over the sharded parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training.engine.batches import BatchSource
from training.engine.strategy import task_units
from training.tasks.loader import load_task, options_from_json

WARMUP_STEPS = 3  # as training.engine.throughput.ThroughputMeter


def distributed(model: nn.Module, strategy: str, task: object, world: int) -> nn.Module:
    """The model as the strategy runs it: a DDP replica, or sharded in place by FSDP2 (unit by unit)."""
    if strategy == "ddp":
        return DistributedDataParallel(model, forward_sync_buffers=False)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for unit in task_units(task, model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="tabular")
    parser.add_argument("--task-options", default="{}")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--global-batch-size", type=int, required=True)
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    args = parser.parse_args()

    torch.set_flush_denormal(True)  # as the trainer does: same numerics on both sides
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    task = load_task(args.task, options_from_json(args.task_options))
    data = task.load(args.data)
    train = BatchSource(data.split("train"), torch.device("cpu"), args.task)
    torch.manual_seed(0)
    model = distributed(task.build_model(data.info), args.strategy, task, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    per_rank = args.global_batch_size // world
    steps_per_epoch = len(train) // args.global_batch_size

    started = time.perf_counter()  # reset after the warm-up steps
    model.train()
    for step in range(args.steps):
        epoch, index = divmod(step, steps_per_epoch)
        if index == 0:
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(epoch))
        start = index * args.global_batch_size + rank * per_rank
        loss = task.loss(model, train.batch(order[start : start + per_rank]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step + 1 == WARMUP_STEPS:
            started = time.perf_counter()
    elapsed = time.perf_counter() - started
    if rank == 0:
        samples = (args.steps - WARMUP_STEPS) * args.global_batch_size
        record = {"samples_per_second": samples / elapsed, "world_size": world, "strategy": args.strategy}
        print(json.dumps(record), flush=True)
    # Leave without tearing the process group down: with torch 2.13 and gloo, freeing DDP's reducer at the
    # end of main() can deadlock (the group's destructor joins its run-loop thread, which is waiting for the
    # GIL to free the last all-reduce's work), and a run once hung there for over ten minutes. Every
    # collective has completed once every rank has passed the barrier.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
