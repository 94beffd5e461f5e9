"""Benchmark: our trainer against a bare DDP loop, and our checkpoints against torch.save and the disk.

    make bench            (or: .venv/bin/python bench/trainer.py [--rounds R])

Side by side in one run, alternating (bare, ours, bare, ours, ...) because this machine is shared and
noisy; the median of each is compared. On a model of over 10 million parameters, 2 processes (torchrun,
gloo), the same data, batch and step count:

1. samples/s of our trainer checkpointing every 20 steps / samples/s of the bare loop   (target >= 0.95)
2. time training is blocked per checkpoint / a synchronous torch.save of the same state (target <= 0.2)
3. our checkpoint write throughput / raw sequential write throughput of the same bytes  (printed)

The ratio in 1 is the median of each round's ours/bare pair, which ran back to back.

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
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch

from training.checkpoint.checkpointer import Checkpointer, CheckpointMeta
from training.checkpoint.local_store import LocalCheckpointStore

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT = REPO_ROOT / "bench" / "out"
NPROC = 2
HIDDEN_WIDTH, HIDDEN_LAYERS = 2304, 3  # 10.8 M parameters
TRAIN_ROWS = 1421  # the sample data's training split
DEFAULT_GLOBAL_BATCH = 1024  # about 0.6 s per step on this machine: a checkpoint every ~12 s
TARGET_STEPS = 100
CHECKPOINT_EVERY = 20
THROUGHPUT_TARGET, BLOCKED_TARGET = 0.95, 0.2

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RETRAIN_HOME": str(OUT / "state")}


def prepare_data() -> Path:
    from training.tasks.tabular.prepare import prepare
    from training.tasks.tabular.sample_data import write_sample_batches

    data = OUT / "prepared"
    if not (data / "manifest.json").exists():
        write_sample_batches(OUT / "raw", batches=4)
        prepare(OUT / "raw", data)
    return data


@dataclass(frozen=True)
class Workload:
    global_batch_size: int

    @property
    def epochs(self) -> int:
        return math.ceil(TARGET_STEPS / (TRAIN_ROWS // self.global_batch_size))

    @property
    def steps(self) -> int:
        return self.epochs * (TRAIN_ROWS // self.global_batch_size)


def run_bare(data: Path, work: Workload) -> float:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}",
        str(REPO_ROOT / "bench" / "bare_ddp.py"), "--data", str(data), "--steps", str(work.steps),
        "--global-batch-size", str(work.global_batch_size), "--hidden-width", str(HIDDEN_WIDTH),
        "--hidden-layers", str(HIDDEN_LAYERS),
    ]  # fmt: skip
    output = subprocess.run(command, env=ENV, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    line = next(line for line in output.stdout.splitlines() if line.startswith("{"))
    return json.loads(line)["samples_per_second"]


def run_ours(data: Path, work: Workload, round_number: int) -> dict:
    run_dir = OUT / f"ours-{round_number}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [
        sys.executable, "-m", "training.cli", "train", "--nproc", str(NPROC), "--data", str(data),
        "--out", str(run_dir / "model"), "--checkpoints", str(run_dir / "checkpoints"),
        "--epochs", str(work.epochs), "--global-batch-size", str(work.global_batch_size),
        "--hidden-width", str(HIDDEN_WIDTH), "--hidden-layers", str(HIDDEN_LAYERS),
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4, help="alternating runs of each (default 4)")
    parser.add_argument("--global-batch-size", type=int, default=DEFAULT_GLOBAL_BATCH)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    data = prepare_data()
    work = Workload(args.global_batch_size)

    bare, ours = [], []
    for round_number in range(1, args.rounds + 1):
        bare.append(run_bare(data, work))
        ours.append(run_ours(data, work, round_number))
        print(f"round {round_number}: bare {bare[-1]:,.0f} samples/s, ours "
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

    result = {
        "date": date.today().isoformat(),
        "parameters": last["parameters"],
        "processes": NPROC,
        "global_batch_size": work.global_batch_size,
        "steps": work.steps,
        "rounds": args.rounds,
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
        "in_training_write_seconds": in_training_write,
        "our_write_megabytes_per_second": our_write_rate / 1e6,
        "raw_write_megabytes_per_second": raw_rate / 1e6,
        "write_throughput_ratio": our_write_rate / raw_rate,
    }
    (OUT / "trainer.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    throughput_ok = result["throughput_ratio"] >= THROUGHPUT_TARGET
    blocked_ok = result["blocked_ratio"] <= BLOCKED_TARGET
    print(f"throughput ratio {result['throughput_ratio']:.3f} (target >= {THROUGHPUT_TARGET}): "
          f"{'ok' if throughput_ok else 'MISSED'}")  # fmt: skip
    print(f"blocked ratio    {result['blocked_ratio']:.3f} (target <= {BLOCKED_TARGET}): "
          f"{'ok' if blocked_ok else 'MISSED'}")  # fmt: skip
    print(f"write throughput ratio {result['write_throughput_ratio']:.3f} (ours vs raw sequential write)")
    return 0 if throughput_ok and blocked_ok else 1


if __name__ == "__main__":
    sys.exit(main())
