"""Per-rank state memory and the checkpoint save path under DDP or FSDP, each against its baseline.

    torchrun --standalone --nproc-per-node=N bench/sharded_save.py --task REF --task-options JSON \
        --data D --global-batch-size B --strategy ddp|fsdp --layout LAYOUT [LAYOUT ...] --folder F

LAYOUT: sharded or single. Several layouts are measured in the one run, side by side: each round saves once
in each (a checkpointer and a folder of its own), each save followed by its own raw baseline; the first
layout's is the one memory and blocked time are measured in.

Every rank builds the training objects as `retrain train` does (training/engine/train_state.py:
`build_training_objects` with the strategy of training/engine/strategy.py, the default AdamW and schedule,
`Strategy.wrap`), trains a few steps with the engine's `TrainStep`, then measures, on the same state:

1. memory: the bytes this rank holds, once training is in its steady state (after the optimizer steps, the
   gradients still there), of its parameters, their gradients and the optimizer's state tensors, each the
   local shard where it is a DTensor (`to_local()`). This is the resident set sharding divides; DDP's
   gradient buckets, activations, FSDP's transient all-gathered units and the interpreter are not in it.
   The process's peak RSS growth from before the model was built is printed beside it, for scale only.
2. the whole save path: a barrier, then our save as the trainer makes it (`checkpoint_state`, then
   `Checkpointer.save` with the trainer's check of the weights: plan, stage, the check of the staged
   weights, serialise with its checksum, write, fsync, publish, the commit record) until
   `wait_until_durable` returns, on every rank that saves; the slowest rank's time. The pruning that
   follows a save's handover is let finish before the baseline runs, so the two never overlap. Back to
   back with it, the baseline: each of those ranks writes the very bytes it wrote (its shard, the
   coordinator also the DCP metadata; the single layout rank 0's file) with os.write and one os.fsync into
   a new file in the same folder, in parallel; the slowest rank's time. Then, printed only, rank 0 alone
   writes all of those bytes into one file the same way. Each raw write runs in a thread at our writer
   thread's priority (nice 19), so that other load on the shared machine slows both sides alike. All rates
   are the checkpoint's total bytes over the time; the ratio is the median of each save's pair. The first
   saves (into fresh pages, before pruning starts) are not counted, as in the steady state of training.
3. (sharded layout) blocked: training's cost per checkpoint as the trainer pays it: `checkpoint_state`,
   `Checkpointer.save` (the weights' check runs in its staging thread) and `wait_until_staged` before the
   next optimizer step (a whole training step runs meanwhile, as in training); the slowest rank's. The
   baseline: a synchronous `torch.distributed.checkpoint.save` of the same live state with torch's own
   `FileSystemWriter` (fsyncing its files) into the same file system; the slowest rank's time.

Rank 0 prints one JSON line. Nothing here changes what it measures: it calls the engine's own functions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.manager import finite_weights_check
from training.checkpoint.records import CheckpointMeta, CheckpointRecord
from training.checkpoint.sharded import METADATA_SUFFIX, ShardGroup, shard_object
from training.engine.batches import BatchSource
from training.engine.config import TrainConfig
from training.engine.distributed import DistContext, init_distributed
from training.engine.heap import keep_freed_heap
from training.engine.strategy import make_strategy
from training.engine.train_state import RunState, TrainingObjects, build_training_objects, checkpoint_state
from training.engine.train_step import TrainStep
from training.tasks.base import loss_takes_info
from training.tasks.loader import load_task, options_from_json

LAYOUTS = ("sharded", "single")
TRAIN_STEPS = 3  # before memory is measured: the optimizer's state exists from the first step


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def state_memory(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state (local shards)."""
    parameters = list(model.parameters())
    optimizer_bytes = sum(
        local_bytes(value)
        for per_parameter in optimizer.state.values()
        for value in per_parameter.values()
        if isinstance(value, torch.Tensor)
    )
    return {
        "parameters": sum(local_bytes(parameter) for parameter in parameters),
        "gradients": sum(local_bytes(p.grad) for p in parameters if p.grad is not None),
        "optimizer_state": optimizer_bytes,
    }


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def slowest(seconds: float) -> float:
    """The largest of every rank's `seconds` (a collective)."""
    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def gathered(value: Any) -> list[Any]:
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def lowest_priority() -> None:
    """As the checkpointer's writer thread (training/checkpoint/checkpointer.py): nice 19, this thread."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def raw_write_seconds(path: Path, payload: bytes) -> float:
    """os.write of `payload` into a new file, then one fsync: what the file system gives. Called in a
    thread at the priority of our writer's, so that the shared machine's other load slows both alike."""
    view = memoryview(payload)
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - started


def my_objects(record: CheckpointRecord, rank: int) -> list[str]:
    """The data objects this rank wrote: its shard (the coordinator also the DCP metadata); in the single
    layout, rank 0's file."""
    if record.layout != "sharded":
        return [record.data_object] if rank == 0 else []
    mine = [shard_object(record.name, rank)] + ([record.name + METADATA_SUFFIX] if rank == 0 else [])
    return [name for name in mine if name in record.objects]


@dataclass
class Variant:
    """One layout measured: its checkpointer (None on a rank that does not save) and its folder."""

    name: str
    checkpointer: Checkpointer | None
    sharded: bool
    folder: Path


@dataclass
class _Figures:
    """One variant's measured saves."""

    size: int = 0
    ours: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    sequential: list[float] = field(default_factory=list)
    write: list[float] = field(default_factory=list)

    def add(self, figures: tuple[int, float, float, float, float]) -> None:
        self.size = figures[0]
        for values, value in zip(
            (self.ours, self.raw, self.sequential, self.write), figures[1:], strict=True
        ):
            values.append(value)

    def summary(self) -> dict[str, Any]:
        def paired(baseline: list[float]) -> list[float]:
            return [theirs / mine for mine, theirs in zip(self.ours, baseline, strict=True)]

        size = self.size
        return {
            "bytes": size,
            "ours_seconds_each": [round(value, 4) for value in self.ours],
            "raw_seconds_each": [round(value, 4) for value in self.raw],
            "raw_one_process_seconds_each": [round(value, 4) for value in self.sequential],
            "checkpointer_write_seconds_each": [round(value, 4) for value in self.write],
            "ours_megabytes_per_second": size / statistics.median(self.ours) / 1e6,
            "raw_megabytes_per_second": size / statistics.median(self.raw) / 1e6,
            "raw_one_process_megabytes_per_second": size / statistics.median(self.sequential) / 1e6,
            "paired_ratios": [round(value, 3) for value in paired(self.raw)],
            "ratio": statistics.median(paired(self.raw)),
            "one_process_ratio": statistics.median(paired(self.sequential)),
        }


class Bench:
    def __init__(self, args: argparse.Namespace, context: DistContext) -> None:
        self.args = args
        self.context = context
        self.folder: Path = args.folder
        options = options_from_json(args.task_options)
        self.task = load_task(args.task, options)
        self.data = self.task.load(args.data)
        primary = "single" if args.layout[0] == "single" else "sharded"
        self.config = TrainConfig(
            data=args.data,
            out=self.folder / "out",
            checkpoints=str(self.folder / "checkpoints"),
            task=args.task,
            task_options=dict(options),
            global_batch_size=args.global_batch_size,
            strategy=args.strategy,
            checkpoint_layout=primary,
        )
        self.sharded = self.config.sharded_checkpoints
        self.rss_before_model = peak_rss_bytes()
        self.strategy = make_strategy(args.strategy, context)
        self.objects: TrainingObjects = build_training_objects(
            self.config, self.task, self.data.info, 1000, context.device, self.strategy
        )
        self.network = self.strategy.wrap(self.objects.model)
        self.batches = BatchSource(self.data.split("train"), context.device, args.task)
        self.step = TrainStep(
            self.task,
            self.batches,
            self.objects.optimization,
            self.objects.precision,
            accumulate_grad_batches=1,
            grad_clip_norm=None,
            loss_info=self.data.info if loss_takes_info(self.task) else None,
        )
        per_rank = args.global_batch_size // context.world_size
        order = torch.randperm(len(self.batches), generator=torch.Generator().manual_seed(0))
        self.indices = order[context.rank * per_rank : (context.rank + 1) * per_rank]
        self.run = RunState()
        self.run.begin_attempt("bench", context.world_size, None)
        self.finite_weights = finite_weights_check(self.objects.model)  # the check the trainer's saves run
        self.saved = 0

    def train(self, before_update: Callable[[], None] = lambda: None) -> None:
        self.step.run(self.network, self.indices, before_update)
        self.run.step += 1

    def meta(self) -> CheckpointMeta:
        self.saved += 1
        return CheckpointMeta(self.saved, 0, 0, "interval", 1, "bench", self.context.world_size, "dv-bench")

    def memory(self) -> dict[str, Any]:
        for _ in range(TRAIN_STEPS):
            self.train()
        mine = state_memory(self.objects.model, self.objects.optimizer)
        mine["total"] = sum(mine.values())
        mine["peak_rss_growth"] = peak_rss_bytes() - self.rss_before_model
        return {"per_rank": gathered(mine)}

    def save_path(self, variants: list[Variant], warmup: int, repeats: int) -> dict[str, Any]:
        """Each variant's whole save path, then the raw parallel write of the same bytes, then (printed
        only) rank 0 writing all of them alone, back to back each time; the variants take turns."""
        measured = {variant.name: _Figures() for variant in variants}
        raw_writer = ThreadPoolExecutor(max_workers=1, initializer=lowest_priority)
        for number in range(warmup + repeats):
            for variant in variants:
                figures = self.save_once(variant, raw_writer)
                if number >= warmup:
                    measured[variant.name].add(figures)
        raw_writer.shutdown()
        return {name: figures.summary() for name, figures in measured.items()}

    def save_once(
        self, variant: Variant, raw_writer: ThreadPoolExecutor
    ) -> tuple[int, float, float, float, float]:
        """One save of `variant` and its baselines: bytes, ours, raw parallel, raw alone, writer seconds."""
        rank = self.context.rank
        store_root = variant.folder

        def raw_seconds(payload: bytes, name: str) -> float:
            target = store_root / name
            seconds = raw_writer.submit(raw_write_seconds, target, payload).result() if payload else 0.0
            target.unlink(missing_ok=True)
            return seconds

        checkpointer = variant.checkpointer
        dist.barrier()
        started = time.perf_counter()
        record = None
        write_seconds = 0.0
        meta = self.meta()  # on every rank, saving or not: their step numbers, so names, stay the same
        if checkpointer is not None:
            state = checkpoint_state(
                self.objects, self.run, self.config, self.data.data_version, variant.sharded
            )
            checkpointer.save(state, meta, verify=self.finite_weights)
            result = checkpointer.wait_until_durable()
            assert result is not None and result.record is not None
            record, write_seconds = result.record, result.write_seconds or 0.0
        ours_seconds = slowest(time.perf_counter() - started)
        if checkpointer is not None:
            checkpointer.wait_until_idle()  # the pruning after the handover: not beside the baseline
        record = gathered(record)[0]  # rank 0 saves in either layout
        mine = b"".join((store_root / name).read_bytes() for name in my_objects(record, rank))
        dist.barrier()
        parallel_seconds = slowest(raw_seconds(mine, f"raw-baseline-{rank}.bin"))
        every = b""
        if rank == 0:
            every = b"".join((store_root / name).read_bytes() for name in record.data_objects)
        dist.barrier()
        alone_seconds = slowest(raw_seconds(every, "raw-baseline-all.bin"))
        return record.size, ours_seconds, parallel_seconds, alone_seconds, slowest(write_seconds)

    def blocked(self, checkpointer: Checkpointer, group: Any, repeats: int) -> dict[str, Any]:
        """Training's cost per checkpoint against a synchronous DCP save of the same state."""
        building, checkpointer_blocked, whole, synchronous = [], [], [], []
        for number in range(repeats):
            dist.barrier()
            started = time.perf_counter()
            state = checkpoint_state(
                self.objects, self.run, self.config, self.data.data_version, self.sharded
            )
            built = time.perf_counter()
            checkpointer.save(state, self.meta(), verify=self.finite_weights)
            self.train(before_update=checkpointer.wait_until_staged)  # training goes on meanwhile
            result = checkpointer.wait_until_durable()
            assert result is not None and result.record is not None
            checkpointer.wait_until_idle()
            building.append(slowest(built - started))
            checkpointer_blocked.append(slowest(result.blocked_seconds))
            whole.append(slowest((built - started) + result.blocked_seconds))

            target = self.folder / f"sync-dcp-{number}"
            dist.barrier()
            started = time.perf_counter()
            state = checkpoint_state(self.objects, self.run, self.config, self.data.data_version, True)
            writer = dcp.FileSystemWriter(target, single_file_per_rank=True, sync_files=True, thread_count=1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                dcp.save(state, storage_writer=writer, process_group=group)
            synchronous.append(slowest(time.perf_counter() - started))
            dist.barrier()
            if self.context.is_primary:
                shutil.rmtree(target, ignore_errors=True)
        sync_median = statistics.median(synchronous)
        return {
            "checkpoint_state_seconds_each": [round(value, 5) for value in building],
            "checkpointer_blocked_seconds_each": [round(value, 5) for value in checkpointer_blocked],
            "whole_blocked_seconds_each": [round(value, 5) for value in whole],
            "sync_dcp_save_seconds_each": [round(value, 4) for value in synchronous],
            "whole_blocked_seconds": statistics.median(whole),
            "checkpointer_blocked_seconds": statistics.median(checkpointer_blocked),
            "sync_dcp_save_seconds": sync_median,
            "ratio": statistics.median(whole) / sync_median,
            "checkpointer_ratio": statistics.median(checkpointer_blocked) / sync_median,
        }


def make_variant(layout: str, folder: Path, context: DistContext) -> Variant:
    """A checkpointer of `layout` writing into a folder of its own."""
    sharded = layout != "single"
    root = folder / f"checkpoints-{layout}"
    store = LocalCheckpointStore(root)
    shards = ShardGroup.create(context.rank, context.world_size) if sharded else None
    saves = sharded or context.is_primary
    checkpointer = Checkpointer(store, keep_last=2, shards=shards) if saves else None
    return Variant(layout, checkpointer, sharded, root)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="tabular")
    parser.add_argument("--task-options", default="{}")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--global-batch-size", type=int, required=True)
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), required=True)
    parser.add_argument(
        "--layout", nargs="+", choices=LAYOUTS, required=True, help="one or more, side by side"
    )
    parser.add_argument("--folder", type=Path, required=True, help="an empty folder on the disk to measure")
    parser.add_argument("--warmup-saves", type=int, default=3)
    # Measured pairs. The disk has busy spells: single pairs range from 0.4 to 1.3 within one run, and the
    # median of 15 pairs ranged 0.72-0.88 across runs of one code; of 30, 0.01-0.02 apart back to back.
    parser.add_argument("--saves", type=int, default=30)
    # Blocked time per save is about 0.1-3 ms, but one save in a few can block 5-20 ms
    # when the machine is busy: a median of 3 saves read 0.17, 17.4 and 6.4 ms once (a ratio of 0.065) and
    # 0.1-0.6 ms in all of 15 saves right after. Each costs under a second here.
    parser.add_argument("--blocked-saves", type=int, default=9)
    args = parser.parse_args()

    torch.set_flush_denormal(True)  # as the trainer does
    keep_freed_heap(os.environ)  # as the worker does (training/engine/heap.py)
    context = init_distributed("cpu")
    if not dist.is_initialized():  # one process: the engine makes no group, the bench's collectives need one
        dist.init_process_group("gloo")
    bench = Bench(args, context)
    result: dict[str, Any] = {
        "strategy": args.strategy,
        "layout": args.layout,
        "world_size": context.world_size,
    }
    result["parameters"] = sum(parameter.numel() for parameter in bench.objects.model.parameters())  # global
    result["memory"] = bench.memory()

    variants = [make_variant(layout, args.folder, context) for layout in args.layout]
    result["save_path"] = bench.save_path(variants, args.warmup_saves, args.saves)
    primary = variants[0]
    if primary.sharded and primary.checkpointer is not None and primary.checkpointer.shards is not None:
        result["blocked"] = bench.blocked(
            primary.checkpointer, primary.checkpointer.shards.group, args.blocked_saves
        )
    for variant in variants:
        if variant.checkpointer is not None:
            variant.checkpointer.close()
    dist.barrier()
    if context.is_primary:
        print(json.dumps(result), flush=True)
    dist.barrier()
    os._exit(0)  # no teardown: freeing a DDP reducer on gloo can deadlock at exit (bench/bare_ddp.py)


if __name__ == "__main__":
    main()
