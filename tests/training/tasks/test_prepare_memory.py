"""Prepare's memory does not grow with the data: a process's peak RSS over what its imports hold, at 1x and
10x the rows, in parts small enough that both sizes span many (bench/data_scale.py measures the same at
200k against 2M rows, with the parts prepare uses by default)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

REPO_ROOT = Path(__file__).resolve().parents[3]
ROWS_PER_PART = 1000

PROBE = """
import sys
from pathlib import Path
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.schema import TableSchema

def peak():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024

before = peak()
schema = TableSchema(key_column="id", label_column="y", feature_columns=None, n_classes=None)
prepare(Path(sys.argv[1]), Path(sys.argv[2]), schema=schema, rows_per_part=int(sys.argv[3]))
print(peak() - before)
"""


def _write(folder: Path, rows: int, files: int = 10) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(rows)
    per = rows // files
    for number in range(files):
        keys = np.arange(number * per, (number + 1) * per) % (rows * 9 // 10)  # a tenth are re-deliveries
        columns = {"id": pa.array([f"r{key:08d}" for key in keys]), "y": pa.array(rng.integers(0, 10, per))}
        columns |= {f"x{column}": pa.array(np.round(rng.normal(size=per), 4)) for column in range(64)}
        pa_csv.write_csv(pa.table(columns), folder / f"batch-{number:04d}.csv")


def _growth(raw: Path, out: Path) -> int:
    environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(raw), str(out), str(ROWS_PER_PART)],
        capture_output=True, text=True, env=environ, cwd=REPO_ROOT, timeout=300, check=True,
    )  # fmt: skip
    return int(result.stdout.split()[-1])


def test_prepare_peak_memory_at_ten_times_the_rows_stays_within_one_and_a_half_times(tmp_path):
    _write(tmp_path / "small", 5_000)
    _write(tmp_path / "large", 50_000)

    small = _growth(tmp_path / "small", tmp_path / "small-out")
    large = _growth(tmp_path / "large", tmp_path / "large-out")

    assert large <= 1.5 * small, (
        f"peak RSS growth {large / 2**20:.0f} MB at 10x, {small / 2**20:.0f} MB at 1x"
    )
