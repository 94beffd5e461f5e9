"""The baseline: a bare hand-written DDP loop, no checkpoints, nothing but training.

    torchrun --standalone --nproc-per-node=N bench/bare_ddp.py --task REF --task-options JSON \
        --data D --steps S --global-batch-size B

Same task as our trainer (so the same data, model, loss), the same optimizer and the same batches: a
gather of the split by a tensor of indices when it takes one, else `default_collate` over its samples. The
difference `bench/trainer.py` measures is the trainer's own machinery (sampling, the per-step rank
agreement, progress, tracking and checkpoints). Rank 0 prints one JSON line with samples/s over the steps
after the same warm-up our trainer skips.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from training.engine.batches import BatchSource
from training.tasks.loader import load_task, options_from_json

WARMUP_STEPS = 3  # as training.engine.throughput.ThroughputMeter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="tabular")
    parser.add_argument("--task-options", default="{}")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--global-batch-size", type=int, required=True)
    args = parser.parse_args()

    torch.set_flush_denormal(True)  # as the trainer does: same numerics on both sides
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    task = load_task(args.task, options_from_json(args.task_options))
    data = task.load(args.data)
    train = BatchSource(data.split("train"), torch.device("cpu"), args.task)
    torch.manual_seed(0)
    model = DistributedDataParallel(task.build_model(data.info), forward_sync_buffers=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    per_rank = args.global_batch_size // world
    steps_per_epoch = len(train) // args.global_batch_size

    started = None
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
        print(json.dumps({"samples_per_second": samples / elapsed, "world_size": world}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
