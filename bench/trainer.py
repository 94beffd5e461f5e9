"""Benchmark: our trainer against a bare DDP loop, and our checkpoints against torch.save and the disk.

    make bench            (or: .venv/bin/python bench/trainer.py [--rounds R] [--case NAME ...])

One case per task (`CASES`: a task reference, its options and how to make its data). For each, side by
side in one run, alternating (bare, ours, bare, ours, ...) because this machine is shared and noisy; the
median of each is compared. 2 processes (torchrun, gloo), the same task (data, model, loss), batch and step
count on both sides:

1. samples/s of our trainer checkpointing every 20 steps / samples/s of the bare loop   (target >= 0.95)
2. time training is blocked per checkpoint / a synchronous torch.save of the same state (target <= 0.2)
3. our checkpoint write throughput / raw sequential write throughput of the same bytes  (printed)

The ratio in 1 is the median of each round's ours/bare pair, which ran back to back. Target 2 applies to
a case whose state is big enough to measure it (the tabular case's 10.8 million parameters).

Writes bench/out/trainer.json; exits non-zero if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import torch

from training.checkpoint.checkpointer import Checkpointer, CheckpointMeta
from training.checkpoint.local_store import LocalCheckpointStore

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT = REPO_ROOT / "bench" / "out"
NPROC = 2
TARGET_STEPS = 100
CHECKPOINT_EVERY = 20
THROUGHPUT_TARGET, BLOCKED_TARGET = 0.95, 0.2

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RETRAIN_HOME": str(OUT / "state")}


def prepare_tabular(folder: Path) -> Path:
    """The digits sample, prepared: 1,421 training rows of 64 features."""
    from training.tasks.tabular.prepare import prepare
    from training.tasks.tabular.sample_data import write_sample_batches

    data = folder / "prepared"
    if not (data / "manifest.json").exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
        write_sample_batches(folder / "raw", batches=4)
        prepare(folder / "raw", data)
    return data


def prepare_image(folder: Path) -> Path:
    """The sample shapes, prepared: 4 classes of 200 PNGs at 32x32 (about 640 training images)."""
    from training.data.splits import SplitFractions
    from training.tasks.image.sample_data import write_sample_images
    from training.tasks.image.task import ImageTask

    data = folder / "prepared"
    if not (data / "manifest.json").exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
        write_sample_images(folder / "raw", per_class=200, seed=0)
        ImageTask().prepare(folder / "raw", data, previous=None, split=SplitFractions())
    return data


@dataclass(frozen=True)
class BenchCase:
    """One task to benchmark: what `--task`/`--task-options` say, how its data is made, and its batch."""

    name: str
    task: str
    options: dict[str, Any]
    prepare: Callable[[Path], Path]  # a work folder -> the prepared data version in it
    global_batch_size: int
    blocked_target: float | None = None  # checked where the checkpoint is big enough to measure it
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def task_options(self) -> str:
        return json.dumps(self.options, sort_keys=True, separators=(",", ":"))


CASES: tuple[BenchCase, ...] = (
    BenchCase(
        name="tabular",
        task="tabular",
        options={"hidden_width": 2304, "hidden_layers": 3},  # 10.8 M parameters
        prepare=prepare_tabular,
        global_batch_size=1024,  # about 0.6 s per step on this machine: a checkpoint every ~12 s
        blocked_target=BLOCKED_TARGET,
    ),
    BenchCase(
        name="image",
        task="image",
        options={"size": 32, "width": 32},  # the built-in CNN as models/shapes.toml configures it
        prepare=prepare_image,
        # About 0.2 s per step here. At 128 (0.1 s) the engine's fixed cost per step (the ranks' loss and
        # eviction vote, tracking) is about 10% of a step on two shared cores (docs/benchmarks.md).
        global_batch_size=256,
    ),
)


@dataclass(frozen=True)
class Workload:
    train_rows: int
    global_batch_size: int

    @property
    def epochs(self) -> int:
        return math.ceil(TARGET_STEPS / (self.train_rows // self.global_batch_size))

    @property
    def steps(self) -> int:
        return self.epochs * (self.train_rows // self.global_batch_size)


def train_rows(case: BenchCase, data: Path) -> int:
    from training.tasks.loader import load_task

    return len(load_task(case.task, case.options).load(data).split("train"))


def run_bare(case: BenchCase, data: Path, work: Workload) -> float:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}",
        str(REPO_ROOT / "bench" / "bare_ddp.py"), "--task", case.task, "--task-options", case.task_options,
        "--data", str(data), "--steps", str(work.steps), "--global-batch-size", str(work.global_batch_size),
    ]  # fmt: skip
    output = subprocess.run(command, env=ENV, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    line = next(line for line in output.stdout.splitlines() if line.startswith("{"))
    return json.loads(line)["samples_per_second"]


def run_ours(case: BenchCase, data: Path, work: Workload, round_number: int) -> dict:
    run_dir = OUT / case.name / f"ours-{round_number}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [
        sys.executable, "-m", "training.cli", "train", "--nproc", str(NPROC), "--data", str(data),
        "--task", case.task, "--task-options", case.task_options,
        "--out", str(run_dir / "model"), "--checkpoints", str(run_dir / "checkpoints"),
        "--epochs", str(work.epochs), "--global-batch-size", str(work.global_batch_size),
        "--checkpoint-every-steps", str(CHECKPOINT_EVERY), "--checkpoint-every-seconds", "off",
        "--progress", "none",
    ]  # fmt: skip
    subprocess.run(command, env=ENV, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    metadata = json.loads((run_dir / "model" / "metadata.json").read_text())
    metadata["checkpoint_dir"] = str(run_dir / "checkpoints")
    return metadata


def sync_torch_save_seconds(checkpoint_file: Path, repeats: int = 3) -> float:
    """A plain synchronous torch.save of the very state our trainer checkpointed, to the same disk."""
    state = torch.load(checkpoint_file, weights_only=True)
    target = checkpoint_file.parent / "sync-baseline.pt"
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.save(state, target)
        timings.append(time.perf_counter() - started)
        target.unlink()
    return statistics.median(timings)


def checkpointer_write_bytes_per_second(checkpoint_file: Path, repeats: int = 5) -> float:
    """Our whole save path (stage, serialise, hash, write, fsync, commit record, prune) on an idle machine.

    In steady state, as in training and as the raw baseline (which deletes each file it wrote), new
    checkpoints reuse the pages pruned ones freed; the first saves, into fresh pages, are not counted.
    """
    state = torch.load(checkpoint_file, weights_only=True)
    folder = checkpoint_file.parent / "checkpointer-baseline"
    checkpointer = Checkpointer(LocalCheckpointStore(folder), keep_last=2)
    rates = []
    warmup = checkpointer.keep_last + 1  # the first save that prunes
    for step in range(1, warmup + repeats + 1):
        meta = CheckpointMeta(step, 0, 0, "interval", 1, "bench", NPROC, "dv-bench")
        checkpointer.save(state, meta)
        result = checkpointer.wait_until_durable()
        if step > warmup:
            rates.append(result.record.size / result.write_seconds)
    checkpointer.close()
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    return statistics.median(rates)


def raw_write_bytes_per_second(checkpoint_file: Path, repeats: int = 5) -> float:
    """Sequential write + fsync of the same bytes to the same disk: what the hardware gives."""
    payload = checkpoint_file.read_bytes()
    target = checkpoint_file.parent / "raw-baseline.bin"
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        with target.open("wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        timings.append(time.perf_counter() - started)
        target.unlink()
    return len(payload) / statistics.median(timings)


def bench_case(case: BenchCase, rounds: int, global_batch_size: int | None) -> dict[str, Any]:
    """One task's rounds of bare and ours, and its checkpoint measurements."""
    data = case.prepare(OUT / case.name)
    work = Workload(train_rows(case, data), global_batch_size or case.global_batch_size)
    bare, ours = [], []
    for round_number in range(1, rounds + 1):
        bare.append(run_bare(case, data, work))
        ours.append(run_ours(case, data, work, round_number))
        print(f"{case.name} round {round_number}: bare {bare[-1]:,.0f} samples/s, ours "
              f"{ours[-1]['throughput']['samples_per_second']:,.0f} samples/s", flush=True)  # fmt: skip

    ours_rates = [run["throughput"]["samples_per_second"] for run in ours]
    # Each round's pair ran back to back, so its ratio is the least disturbed by the machine's drift.
    paired_ratios = [mine / theirs for mine, theirs in zip(ours_rates, bare, strict=True)]
    blocked = statistics.median(run["checkpoints"]["blocked_seconds_mean"] for run in ours)
    in_training_write = statistics.median(run["checkpoints"]["write_seconds_mean"] for run in ours)
    last = ours[-1]
    checkpoint_file = max(Path(last["checkpoint_dir"]).glob("*.pt"))
    sync_save = sync_torch_save_seconds(checkpoint_file)
    raw_rate = raw_write_bytes_per_second(checkpoint_file)
    our_write_rate = checkpointer_write_bytes_per_second(checkpoint_file)
    return {
        "task": case.task,
        "task_options": case.options,
        "parameters": last["parameters"],
        "train_rows": work.train_rows,
        "processes": NPROC,
        "global_batch_size": work.global_batch_size,
        "steps": work.steps,
        "rounds": rounds,
        "bare_samples_per_second_each": [round(rate, 1) for rate in bare],
        "ours_samples_per_second_each": [round(rate, 1) for rate in ours_rates],
        "checkpoint_every_steps": CHECKPOINT_EVERY,
        "checkpoint_megabytes": last["checkpoints"]["bytes_per_checkpoint"] / 1e6,
        "bare_samples_per_second": statistics.median(bare),
        "ours_samples_per_second": statistics.median(ours_rates),
        "paired_throughput_ratios": [round(ratio, 3) for ratio in paired_ratios],
        "throughput_ratio": statistics.median(paired_ratios),
        "blocked_seconds_per_checkpoint": blocked,
        "sync_torch_save_seconds": sync_save,
        "blocked_ratio": blocked / sync_save,
        "blocked_target": case.blocked_target,
        "in_training_write_seconds": in_training_write,
        "our_write_megabytes_per_second": our_write_rate / 1e6,
        "raw_write_megabytes_per_second": raw_rate / 1e6,
        "write_throughput_ratio": our_write_rate / raw_rate,
        **case.notes,
    }


def report(name: str, result: dict[str, Any]) -> bool:
    """Print one case's verdicts; whether it met its targets."""
    throughput_ok = result["throughput_ratio"] >= THROUGHPUT_TARGET
    target = result["blocked_target"]
    blocked_ok = target is None or result["blocked_ratio"] <= target
    print(f"{name}: throughput ratio {result['throughput_ratio']:.3f} (target >= {THROUGHPUT_TARGET}): "
          f"{'ok' if throughput_ok else 'MISSED'}")  # fmt: skip
    print(f"{name}: blocked ratio    {result['blocked_ratio']:.3f} "
          f"({f'target <= {target}' if target is not None else 'printed'}): "
          f"{'ok' if blocked_ok else 'MISSED'}")  # fmt: skip
    ratio = result["write_throughput_ratio"]
    print(f"{name}: write throughput ratio {ratio:.3f} (ours vs raw sequential write)")
    return throughput_ok and blocked_ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [case.name for case in CASES]
    parser.add_argument("--rounds", type=int, default=4, help="alternating runs of each (default 4)")
    parser.add_argument(
        "--case", action="append", choices=names, help=f"only this case (repeatable; default all: {names})"
    )
    parser.add_argument("--global-batch-size", type=int, help="override every case's global batch")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    chosen = [case for case in CASES if not args.case or case.name in args.case]
    results = {case.name: bench_case(case, args.rounds, args.global_batch_size) for case in chosen}
    document = {"date": date.today().isoformat(), "cases": results}
    (OUT / "trainer.json").write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document, indent=2))
    verdicts = [report(name, result) for name, result in results.items()]
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
