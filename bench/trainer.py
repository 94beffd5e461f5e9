"""Benchmark: our trainer against bare DDP and FSDP loops, and our checkpoints against torch and the disk.

    make bench            (or: .venv/bin/python bench/trainer.py [--section ddp|fsdp|sharding ...]
                                [--rounds R] [--fsdp-rounds R] [--case NAME ...])

Everything runs side by side in one run, ours and its baseline alternating (bare, ours, bare, ours, ...)
or back to back, because this machine is shared and noisy; medians are compared. 2 processes (torchrun,
gloo on CPU), the same task (data, model, loss), batch and step count on both sides.

Section ddp: one case per task (`CASES`: a task reference, its options and how to make its data).
1. samples/s of our trainer checkpointing every 20 steps / samples/s of the bare DDP loop  (target >= 0.95)
2. time training is blocked per checkpoint / a synchronous torch.save of the same state  (target <= 0.2)
3. our checkpoint write throughput / raw sequential write throughput of the same bytes   (printed)
The ratio in 1 is the median of each round's ours/bare pair, which ran back to back. Target 2 applies to
a case whose state is big enough to measure it (the tabular case's 10.8 million parameters).

Sections fsdp and sharding (issue 23), on the tabular case's model:
4. samples/s of `retrain train --strategy fsdp` (sharded checkpoints every 15 steps) / samples/s of the
   bare FSDP loop, `bench/bare_ddp.py --strategy fsdp` (the same units)                  (target >= 0.95)
5. bytes per rank of parameters, gradients and optimizer state (local shards, steady state), FSDP / DDP
                                                                                          (target <= 0.6)
6. our whole save path's rate (state dict, stage, the weights' check, serialise, checksum, write, fsync,
   commit record; all ranks) / a raw os.write + fsync of the same bytes by the same ranks in parallel,
   for DDP and FSDP in the sharded layout                                                 (target >= 0.8)
   (and the single-file layout's, printed)
7. training blocked per checkpoint (the state dict, `Checkpointer.save`, which checks the weights off
   the training thread, and `wait_until_staged`) / a synchronous `torch.distributed.checkpoint.save` of
   the same state, sharded layout, DDP and FSDP                                          (target <= 0.04)
5 to 7 come from `bench/sharded_save.py`, which builds the training objects with the engine's own
functions under torchrun; its docstring says exactly what each measures.

Writes bench/out/trainer.json; prints every figure, then exits non-zero if a target is missed.
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

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import CheckpointMeta

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT = REPO_ROOT / "bench" / "out"
NPROC = 2
TARGET_STEPS = 100
CHECKPOINT_EVERY = 20
THROUGHPUT_TARGET, BLOCKED_TARGET = 0.95, 0.2
RUN_TIMEOUT_SECONDS = 900  # one run of either side; a hung one fails the bench instead of stalling it

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
    target_steps: int = TARGET_STEPS

    @property
    def epochs(self) -> int:
        return math.ceil(self.target_steps / (self.train_rows // self.global_batch_size))

    @property
    def steps(self) -> int:
        return self.epochs * (self.train_rows // self.global_batch_size)


def train_rows(case: BenchCase, data: Path) -> int:
    from training.tasks.loader import load_task

    return len(load_task(case.task, case.options).load(data).split("train"))


def torchrun(script: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}",
        str(REPO_ROOT / "bench" / script),
    ]  # fmt: skip


def run_bare(case: BenchCase, data: Path, work: Workload, strategy: str = "ddp") -> float:
    command = [
        *torchrun("bare_ddp.py"), "--task", case.task, "--task-options", case.task_options,
        "--strategy", strategy, "--data", str(data), "--steps", str(work.steps),
        "--global-batch-size", str(work.global_batch_size),
    ]  # fmt: skip
    output = checked_run(command)
    line = next(line for line in output.splitlines() if line.startswith("{"))
    return json.loads(line)["samples_per_second"]


def run_ours(
    case: BenchCase,
    data: Path,
    work: Workload,
    round_number: int,
    strategy: str = "ddp",
    checkpoint_every: int = CHECKPOINT_EVERY,
) -> dict:
    run_dir = (
        OUT / case.name / (f"ours-{round_number}" if strategy == "ddp" else f"ours-{strategy}-{round_number}")
    )
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [
        sys.executable, "-m", "training.cli", "train", "--nproc", str(NPROC), "--data", str(data),
        "--task", case.task, "--task-options", case.task_options,
        "--out", str(run_dir / "model"), "--checkpoints", str(run_dir / "checkpoints"),
        "--epochs", str(work.epochs), "--global-batch-size", str(work.global_batch_size),
        "--checkpoint-every-steps", str(checkpoint_every), "--checkpoint-every-seconds", "off",
        "--progress", "none",
    ]  # fmt: skip
    if strategy != "ddp":
        command += ["--strategy", strategy]  # its checkpoint layout: auto, the sharded one under FSDP
    checked_run(command)
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
        assert result is not None and result.record is not None and result.write_seconds is not None
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


# -- FSDP and sharded checkpoints (issue 23) ---------------------------------------------------------------

SHARDING_CASE = (
    "tabular"  # the DDP tabular case's model (10.8 M parameters): big enough for the shards to matter
)
FSDP_STEPS = 30  # about 0.9 s a step under FSDP here: a round is about 80 s
FSDP_CHECKPOINT_EVERY = 15  # one checkpoint in the measured steps, every ~13 s as in the DDP case
FSDP_ROUNDS = 3
FSDP_THROUGHPUT_TARGET = 0.95  # ours / the bare FSDP loop, samples/s
MEMORY_TARGET = 0.6  # FSDP / DDP, per rank: parameters, gradients and optimizer state
WRITE_RATE_TARGET = 0.8  # our whole save path / a raw parallel write + fsync of the same bytes
SHARDED_BLOCKED_TARGET = 0.04  # training blocked per checkpoint / a synchronous DCP save of the same state
# (strategy, checkpoint layouts side by side) of each run of bench/sharded_save.py; the target applies to
# the sharded layout, the single file is printed only.
SAVE_RUNS = (("fsdp", ("sharded",)), ("ddp", ("sharded", "single")))


def bench_fsdp(case: BenchCase, rounds: int, global_batch_size: int | None) -> dict[str, Any]:
    """`retrain train --strategy fsdp` against the bare FSDP loop, alternating, on the same task."""
    data = case.prepare(OUT / case.name)
    work = Workload(train_rows(case, data), global_batch_size or case.global_batch_size, FSDP_STEPS)
    bare, ours = [], []
    for round_number in range(1, rounds + 1):
        bare.append(run_bare(case, data, work, "fsdp"))
        ours.append(run_ours(case, data, work, round_number, "fsdp", FSDP_CHECKPOINT_EVERY))
        print(f"fsdp {case.name} round {round_number}: bare {bare[-1]:,.0f} samples/s, ours "
              f"{ours[-1]['throughput']['samples_per_second']:,.0f} samples/s", flush=True)  # fmt: skip
    ours_rates = [run["throughput"]["samples_per_second"] for run in ours]
    paired_ratios = [mine / theirs for mine, theirs in zip(ours_rates, bare, strict=True)]
    last = ours[-1]
    return {
        "task": case.task,
        "task_options": case.options,
        "parameters": last["parameters"],
        "processes": NPROC,
        "global_batch_size": work.global_batch_size,
        "steps": work.steps,
        "rounds": rounds,
        "checkpoint_every_steps": FSDP_CHECKPOINT_EVERY,
        "checkpoint_layout": last["checkpoints"]["layout"],
        "checkpoint_megabytes": last["checkpoints"]["bytes_per_checkpoint"] / 1e6,
        "bare_samples_per_second_each": [round(rate, 1) for rate in bare],
        "ours_samples_per_second_each": [round(rate, 1) for rate in ours_rates],
        "bare_samples_per_second": statistics.median(bare),
        "ours_samples_per_second": statistics.median(ours_rates),
        "paired_throughput_ratios": [round(ratio, 3) for ratio in paired_ratios],
        "throughput_ratio": statistics.median(paired_ratios),
        # rank 0's Checkpointer figures in training (metadata.json), beside bench/sharded_save.py's
        "in_training_checkpointer_blocked_seconds": statistics.median(
            run["checkpoints"]["blocked_seconds_mean"] for run in ours
        ),
        "in_training_write_seconds": statistics.median(
            run["checkpoints"]["write_seconds_mean"] for run in ours
        ),
    }


def run_save_driver(
    case: BenchCase, data: Path, strategy: str, layouts: tuple[str, ...], global_batch_size: int
) -> dict:
    folder = OUT / case.name / f"saves-{strategy}"
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    command = [
        *torchrun("sharded_save.py"), "--task", case.task, "--task-options", case.task_options,
        "--data", str(data), "--global-batch-size", str(global_batch_size), "--strategy", strategy,
        "--layout", *layouts, "--folder", str(folder),
    ]  # fmt: skip
    output = checked_run(command)
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    return json.loads(next(line for line in output.splitlines() if line.startswith("{")))


def bench_sharding(case: BenchCase, global_batch_size: int | None) -> dict[str, Any]:
    """Per-rank state memory, the save path's write rate, training's block per save (sharded_save.py)."""
    data = case.prepare(OUT / case.name)
    batch = global_batch_size or case.global_batch_size
    runs = {}
    for strategy, layouts in SAVE_RUNS:
        runs[strategy] = run_save_driver(case, data, strategy, layouts, batch)
        print(f"saves {strategy}: done", flush=True)

    def per_rank_peak(name: str) -> dict[str, int]:
        ranks = runs[name]["memory"]["per_rank"]
        return max(ranks, key=lambda rank: rank["total"])

    fsdp_memory, ddp_memory = per_rank_peak("fsdp"), per_rank_peak("ddp")
    return {
        "task": case.task,
        "task_options": case.options,
        "parameters": runs["fsdp"]["parameters"],
        "processes": NPROC,
        "memory": {
            "fsdp_per_rank": fsdp_memory,
            "ddp_per_rank": ddp_memory,
            "ratio": fsdp_memory["total"] / ddp_memory["total"],
        },
        "save_path": {
            f"{strategy}-{layout}": path
            for strategy, run in runs.items()
            for layout, path in run["save_path"].items()
        },
        "blocked": {f"{name}-sharded": run["blocked"] for name, run in runs.items() if "blocked" in run},
    }


def checked_run(command: list[str]) -> str:
    """Run `command` (in the bench's environment); its stdout, or its stderr's end raised if it fails."""
    done = subprocess.run(
        command, env=ENV, cwd=REPO_ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} ... failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def report_fsdp(result: dict[str, Any]) -> bool:
    ratio = result["throughput_ratio"]
    ok = ratio >= FSDP_THROUGHPUT_TARGET
    print(f"fsdp: samples/s ours {result['ours_samples_per_second']:,.0f} vs bare FSDP loop "
          f"{result['bare_samples_per_second']:,.0f}: ratio {ratio:.3f} (pairs "
          f"{', '.join(f'{pair:.3f}' for pair in result['paired_throughput_ratios'])}; target >= "
          f"{FSDP_THROUGHPUT_TARGET}): {verdict(ok)}")  # fmt: skip
    return ok


def report_sharding(result: dict[str, Any]) -> bool:
    memory = result["memory"]
    fsdp, ddp = memory["fsdp_per_rank"], memory["ddp_per_rank"]
    memory_ok = memory["ratio"] <= MEMORY_TARGET
    print(f"memory per rank (parameters + gradients + optimizer state, local shards, steady state): FSDP "
          f"{fsdp['total'] / 1e6:.1f} MB vs DDP {ddp['total'] / 1e6:.1f} MB: ratio {memory['ratio']:.3f} "
          f"(target <= {MEMORY_TARGET}): {verdict(memory_ok)}")  # fmt: skip
    print(f"  FSDP {fsdp['parameters'] / 1e6:.1f} + {fsdp['gradients'] / 1e6:.1f} + "
          f"{fsdp['optimizer_state'] / 1e6:.1f} MB; DDP {ddp['parameters'] / 1e6:.1f} + "
          f"{ddp['gradients'] / 1e6:.1f} + {ddp['optimizer_state'] / 1e6:.1f} MB; peak RSS growth, for "
          f"scale: FSDP {fsdp['peak_rss_growth'] / 1e6:.0f} MB, "
          f"DDP {ddp['peak_rss_growth'] / 1e6:.0f} MB")  # fmt: skip
    all_ok = memory_ok
    for name, path in result["save_path"].items():
        checked = name.endswith("-sharded")
        ok = path["ratio"] >= WRITE_RATE_TARGET
        all_ok = all_ok and (ok or not checked)
        print(f"save path {name}: {path['bytes'] / 1e6:.1f} MB at {path['ours_megabytes_per_second']:,.0f} "
              f"MB/s vs raw parallel write + fsync {path['raw_megabytes_per_second']:,.0f} MB/s: ratio "
              f"{path['ratio']:.3f} (pairs {', '.join(f'{pair:.3f}' for pair in path['paired_ratios'])}; "
              f"{f'target >= {WRITE_RATE_TARGET}): {verdict(ok)}' if checked else 'printed)'}; vs one "
              f"process writing it all {path['raw_one_process_megabytes_per_second']:,.0f} MB/s: "
              f"{path['one_process_ratio']:.3f}")  # fmt: skip
    for name, blocked in result["blocked"].items():
        ok = blocked["ratio"] <= SHARDED_BLOCKED_TARGET
        all_ok = all_ok and ok
        print(f"blocked per checkpoint {name}: {blocked['whole_blocked_seconds'] * 1000:.1f} ms (state dict "
              f"{statistics.median(blocked['checkpoint_state_seconds_each']) * 1000:.1f}, Checkpointer "
              f"{blocked['checkpointer_blocked_seconds'] * 1000:.2f}) vs synchronous DCP save "
              f"{blocked['sync_dcp_save_seconds'] * 1000:.0f} ms: ratio {blocked['ratio']:.3f} (target <= "
              f"{SHARDED_BLOCKED_TARGET}): {verdict(ok)}; the Checkpointer's own: "
              f"{blocked['checkpointer_ratio']:.4f}")  # fmt: skip
    return all_ok


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
    sections = ("ddp", "fsdp", "sharding")
    parser.add_argument(
        "--section", action="append", choices=sections,
        help="only this part (repeatable; default all): ddp = each case against the bare DDP loop; fsdp = "
        "--strategy fsdp against the bare FSDP loop; sharding = memory per rank, save path, blocked time",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=4, help="alternating runs of each DDP case (default 4)")
    parser.add_argument(
        "--fsdp-rounds", type=int, default=FSDP_ROUNDS, help=f"alternating FSDP runs (default {FSDP_ROUNDS})"
    )
    parser.add_argument(
        "--case", action="append", choices=names, help=f"only this case (repeatable; default all: {names})"
    )
    parser.add_argument("--global-batch-size", type=int, help="override every case's global batch")
    args = parser.parse_args()
    chosen_sections = args.section or list(sections)
    OUT.mkdir(parents=True, exist_ok=True)
    chosen = [case for case in CASES if not args.case or case.name in args.case]
    sharding_case = next(case for case in CASES if case.name == SHARDING_CASE)
    document: dict[str, Any] = {"date": date.today().isoformat()}
    if "ddp" in chosen_sections:
        document["cases"] = {
            case.name: bench_case(case, args.rounds, args.global_batch_size) for case in chosen
        }
    if "fsdp" in chosen_sections:
        document["fsdp"] = bench_fsdp(sharding_case, args.fsdp_rounds, args.global_batch_size)
    if "sharding" in chosen_sections:
        document["sharding"] = bench_sharding(sharding_case, args.global_batch_size)
    (OUT / "trainer.json").write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document, indent=2))
    verdicts = [report(name, result) for name, result in document.get("cases", {}).items()]
    if "fsdp" in document:
        verdicts.append(report_fsdp(document["fsdp"]))
    if "sharding" in document:
        verdicts.append(report_sharding(document["sharding"]))
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
