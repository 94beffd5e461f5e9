"""Benchmark: what a retrain costs as its data grows (issue 42), for the built-in tabular task.

    make bench            (or: .venv/bin/python bench/data_scale.py [--rows N] [--scale K])

Data: digits-like rows (each a random bundled digit with every pixel moved by -1, 0 or +1 and kept in
0..16, under a key of its own), as CSV batches of 50,000 rows: N rows (1x, default 200,000) and N*K rows
(Kx, default 10x). Every step runs as the pipeline runs it, a `retrain` process of its own, and its peak
RSS is its own and its children's largest, read from wait4's resource usage.

1. Peak RSS of each step at 1x and Kx, each on the step before's outputs: `retrain prepare`, `retrain
   train` (one process, one epoch of a small MLP), `retrain evaluate`, `retrain register`, `retrain drift`
   (the raw files against the prepared version).
                                                                       (Kx / 1x <= 1.5 for every step)
2. What a new version costs: the Kx data pinned (as `retrain run` pins it) and prepared, then 1 % new rows
   landed as one more batch, pinned and prepared incrementally (`--previous`). The state folder's growth,
   each stored file counted once however many versions link it, over the new raw bytes.
                                                                       (<= 4, plus 8 MB)
3. That incremental prepare's time against a full prepare of the same raw files, and whether both give
   the same data version (its content hash).                          (<= 0.2; equal)
4. Training throughput from the shards against the same task with every split held in
   memory (bench/in_memory_task.py, the path it took before), at 1x, a size that fits in memory: one
   training process, three epochs of the small MLP, alternating, 4 pairs; the median of each pair's
   samples/s ratio.                                                    (>= 0.95)

Writes bench/out/data_scale.json; exits non-zero if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from components.data_version import snapshot_folder  # noqa: E402
from core.objects import bytes_stored  # noqa: E402
from training.tasks.tabular.sample_data import digits_table  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"
WORK = OUT / "data_scale"
BATCH_ROWS = 50_000
RSS_TARGET, STORED_TARGET, STORED_SLACK, INCREMENT_TARGET, THROUGHPUT_TARGET = 1.5, 4.0, 8 << 20, 0.2, 0.95
TASK_OPTIONS = json.dumps({"hidden_width": 64})  # a small model: this measures the data's cost, not its
RETRAIN = [sys.executable, "-m", "retrain_cli"]


def write_rows(folder: Path, rows: int, first_key: int, seed: int) -> None:
    """`rows` digits-like rows under keys first_key.. as CSV batches of BATCH_ROWS rows in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    digits = digits_table()
    pixels = np.column_stack([digits.column(f"pixel_{i}").to_numpy() for i in range(64)])
    labels = digits.column("label").to_numpy()
    rng = np.random.default_rng(seed)
    for start in range(0, rows, BATCH_ROWS):
        count = min(BATCH_ROWS, rows - start)
        chosen = rng.integers(0, len(labels), count)
        jittered = np.clip(pixels[chosen] + rng.integers(-1, 2, (count, 64)), 0, 16)
        keys = [f"k{first_key + start + row:09d}" for row in range(count)]
        columns = {"row_key": pa.array(keys), "label": pa.array(labels[chosen])}
        columns.update({f"pixel_{i}": pa.array(jittered[:, i]) for i in range(64)})
        name = f"batch-{(first_key + start) // BATCH_ROWS:05d}.csv"
        pa_csv.write_csv(pa.table(columns), folder / name)


# A process's peak RSS survives exec (Linux keeps the larger of the old image's and the new one's), so a step
# started straight from this process would report at least this process's size. A bare interpreter
# (`-S`: no site packages, a few MB) starts each step instead and hands back what wait4 says of it.
_MEASURED_START = """import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as report:
    report.write(f"{usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
"""


def run_step(argv: list[str], environ: dict[str, str]) -> dict[str, Any]:
    """One `retrain` step in a process of its own: its wall time and peak RSS (its and its children's
    largest, from wait4)."""
    report = WORK / "step.rusage"
    started = time.perf_counter()
    with (WORK / "steps.log").open("a") as log:
        subprocess.run(
            [sys.executable, "-S", "-c", _MEASURED_START, str(report), *RETRAIN, *argv],
            cwd=REPO_ROOT, env=environ, stdout=log, stderr=log, check=True,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    peak_kb, code = (int(word) for word in report.read_text().split())
    if code != 0:
        tail = (WORK / "steps.log").read_text()[-3000:]
        raise SystemExit(f"retrain {argv[0]} exited {code}:\n{tail}")
    return {"seconds": seconds, "peak_rss_mb": peak_kb / 1024}


def steps_at(label: str, raw: Path, environ: dict[str, str]) -> dict[str, Any]:
    """Every step's peak RSS on the data in `raw`, each step on the last one's outputs."""
    base = WORK / label
    prepared, tracking = base / "prepared", f"sqlite:///{WORK / 'mlflow.db'}"  # one registry for both sizes
    task = ["--task", "tabular", "--task-options", TASK_OPTIONS]
    model, evaluation, registration = base / "model", base / "evaluation", base / "registration"
    store = ["--model-name", "digits", "--mlflow-tracking-uri", tracking]
    return {
        "prepare": run_step(["prepare", *task, "--raw", str(raw), "--out", str(prepared)], environ),
        "train": run_step(
            ["train", "--nproc", "1", "--data", str(prepared), *task, "--epochs", "1", "--global-batch-size",
             "1024", "--progress", "none", "--out", str(model), "--checkpoints", str(base / "checkpoints"),
             "--mlflow-tracking-uri", tracking, "--mlflow-experiment", "digits"],
            environ,
        ),
        "evaluate": run_step(
            ["evaluate", "--model", str(model), "--data", str(prepared), "--out", str(evaluation), *task,
             *store],
            environ,
        ),
        "register": run_step(
            ["register", "--model", str(model), "--evaluation", str(evaluation), "--data", str(prepared),
             "--raw-data-version", "rd-0123456789abcdef", "--environment-version", "3", "--out",
             str(registration), "--lock", str(base / "locks"), "--mlflow-experiment", "digits", *task,
             *store],
            environ,
        ),
        "drift": run_step(
            ["drift", "--model-name", "digits", "--current", str(raw), "--reference", str(prepared), *task,
             "--out", str(base / "drift"), "--no-publish", "--mlflow-tracking-uri", tracking],
            environ,
        ),
    }  # fmt: skip


def shards_against_memory(prepared: Path, environ: dict[str, str], rounds: int = 4) -> dict[str, Any]:
    """samples/s of one training process over the shards, against the same task with every split
    held in memory (bench/in_memory_task.py), alternating which goes first: the median of the pairs."""
    tasks = {"memory": f"{REPO_ROOT / 'bench' / 'in_memory_task.py'}:InMemoryTabular", "shards": "tabular"}
    pairs = []
    for round_ in range(rounds):
        seconds = {}
        for name in ("memory", "shards") if round_ % 2 else ("shards", "memory"):
            out = WORK / "throughput" / f"{name}-{round_}"
            run_step(
                ["train", "--nproc", "1", "--data", str(prepared), "--task", tasks[name], "--task-options",
                 TASK_OPTIONS, "--epochs", "3", "--global-batch-size", "256", "--progress", "none",
                 "--no-mlflow", "--out", str(out), "--checkpoints", str(out.with_suffix(".checkpoints"))],
                environ,
            )  # fmt: skip
            seconds[name] = json.loads((out / "metadata.json").read_text())["wall_time_seconds"]
        pairs.append(seconds["memory"] / seconds["shards"])
    return {"pairs": pairs, "ratio": statistics.median(pairs)}


def new_version_cost(raw: Path, rows: int, environ: dict[str, str]) -> dict[str, Any]:
    """Pin and prepare `raw`, land 1 % new rows, pin and prepare again incrementally; then a full prepare
    of the same raw files beside it."""
    state = WORK / "versions"
    landing = state / "landing"
    shutil.copytree(raw, landing)
    pinned_root = state / "data" / "digits"
    _, first = snapshot_folder(landing, pinned_root)
    task = ["--task", "tabular", "--task-options", TASK_OPTIONS]
    run_step(["prepare", *task, "--raw", str(first), "--out", str(state / "prepared-1")], environ)
    before = bytes_stored(state) - bytes_stored(landing)
    write_rows(landing, rows // 100, first_key=10**8, seed=7)
    new_bytes = sum(path.stat().st_size for path in landing.glob("batch-02*.csv"))
    _, second = snapshot_folder(landing, pinned_root)
    incremental = run_step(
        ["prepare", *task, "--raw", str(second), "--out", str(state / "prepared-2"), "--previous",
         str(state / "prepared-1")],
        environ,
    )  # fmt: skip
    grown = bytes_stored(state) - bytes_stored(landing) - before
    full = run_step(["prepare", *task, "--raw", str(second), "--out", str(WORK / "full-2")], environ)
    versions = [json.loads((folder / "manifest.json").read_text())["data_version"]
                for folder in (state / "prepared-2", WORK / "full-2")]  # fmt: skip
    return {
        "new_raw_bytes": new_bytes,
        "stored_growth_bytes": grown,
        "stored_per_new_byte": grown / new_bytes,
        "stored_ok": grown <= STORED_TARGET * new_bytes + STORED_SLACK,
        "incremental_s": incremental["seconds"],
        "full_s": full["seconds"],
        "incremental_over_full": incremental["seconds"] / full["seconds"],
        "incremental_ok": incremental["seconds"] <= INCREMENT_TARGET * full["seconds"],
        "same_version": versions[0] == versions[1],
        "versions": versions,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000, help="rows at 1x (default 200,000)")
    parser.add_argument("--scale", type=int, default=10, help="the larger size, as a multiple (default 10)")
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    environ = {**os.environ, "RETRAIN_HOME": str(WORK / "home"), "PYTHONPATH": str(REPO_ROOT),
               "RETRAIN_WARM_START": "off"}  # fmt: skip
    environ.pop("MLFLOW_TRACKING_URI", None)
    small, large = WORK / "raw-1x", WORK / f"raw-{args.scale}x"
    write_rows(small, args.rows, 0, seed=1)
    write_rows(large, args.rows * args.scale, 0, seed=1)
    at_1x = steps_at("1x", small, environ)
    at_kx = steps_at(f"{args.scale}x", large, environ)
    result: dict[str, Any] = {"date": date.today().isoformat(), "rows": args.rows, "scale": args.scale}
    ok = True
    print(f"peak RSS, {args.rows:,} rows (1x) against {args.rows * args.scale:,} ({args.scale}x):")
    for step in ("prepare", "train", "evaluate", "register", "drift"):
        ratio = at_kx[step]["peak_rss_mb"] / at_1x[step]["peak_rss_mb"]
        met = ratio <= RSS_TARGET
        ok &= met
        result[step] = {"1x": at_1x[step], "kx": at_kx[step], "ratio": ratio}
        print(f"  {step:<9} {at_1x[step]['peak_rss_mb']:7.0f} MB  {at_kx[step]['peak_rss_mb']:7.0f} MB  "
              f"ratio {ratio:5.2f} (target <= {RSS_TARGET}): {'ok' if met else 'MISSED'}")  # fmt: skip
    cost = new_version_cost(large, args.rows * args.scale, environ)
    result["new_version"] = cost
    print(f"1 % new rows ({cost['new_raw_bytes'] / 1e6:.1f} MB of CSV): the state grew "
          f"{cost['stored_growth_bytes'] / 1e6:.1f} MB, {cost['stored_per_new_byte']:.1f}x the new bytes "
          f"(target <= {STORED_TARGET} + 8 MB): {'ok' if cost['stored_ok'] else 'MISSED'}")  # fmt: skip
    verdict = "ok" if cost["incremental_ok"] else "MISSED"
    print(f"incremental prepare {cost['incremental_s']:.1f} s against a full one {cost['full_s']:.1f} s: "
          f"{cost['incremental_over_full']:.2f} (target <= {INCREMENT_TARGET}): {verdict}; "
          f"same data version: {cost['same_version']}")  # fmt: skip
    throughput = shards_against_memory(WORK / "1x" / "prepared", environ)
    result["training_from_shards"] = throughput
    met = throughput["ratio"] >= THROUGHPUT_TARGET
    ok &= met
    print(f"training from shards / in memory, {args.rows:,} rows: {throughput['ratio']:.3f} (pairs "
          f"{', '.join(f'{r:.3f}' for r in throughput['pairs'])}; target >= {THROUGHPUT_TARGET}): "
          f"{'ok' if met else 'MISSED'}")  # fmt: skip
    ok &= cost["stored_ok"] and cost["incremental_ok"] and cost["same_version"]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "data_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
