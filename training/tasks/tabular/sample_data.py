"""Sample raw data: the digits data set bundled with scikit-learn, written as raw batch files.

This stands in for the data that lands in Blob Storage, so that the whole pipeline runs with no download.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from core.errors import InputError
from core.files import write_atomically
from training.tasks.tabular.schema import DIGITS_SCHEMA

FILE_FORMATS = ("csv", "parquet")
IMAGE_SIDE = 8  # the digits are 8x8 images, pixel_0..pixel_63 row by row
MAX_PIXEL = 16  # their pixel values are whole numbers from 0 to 16
# Upstream systems re-deliver records (retries, replays); the sample mimics it so dedupe has work to do.
OVERLAP_ROWS = 5


def digits_table() -> pa.Table:
    """The 1797 digits images, one row each: `row_key` (digits-0000, ...), `label`, `pixel_0..pixel_63`."""
    from sklearn.datasets import load_digits  # heavy import, needed only here

    digits = load_digits()
    pixels = digits.data.astype(np.int64)
    columns: dict[str, pa.Array] = {
        DIGITS_SCHEMA.key_column: pa.array([f"digits-{index:04d}" for index in range(len(pixels))]),
        DIGITS_SCHEMA.label_column: pa.array(digits.target.astype(np.int64)),
    }
    for position, name in enumerate(DIGITS_SCHEMA.feature_columns):
        columns[name] = pa.array(pixels[:, position])
    return pa.table(columns)


def batch_ranges(n_rows: int, batches: int, overlap: int = OVERLAP_ROWS) -> list[range]:
    """Row ranges of each batch: near-equal consecutive chunks, each after the first also re-delivering
    the last `overlap` rows of the previous chunk (fewer if that chunk is shorter)."""
    bounds = np.linspace(0, n_rows, batches + 1).round().astype(int)
    ranges = []
    previous_start = 0
    for start, stop in itertools.pairwise(bounds):
        re_delivered = min(overlap, start - previous_start)
        ranges.append(range(int(start - re_delivered), int(stop)))
        previous_start = start
    return ranges


def batch_file_name(number: int, file_format: str) -> str:
    """Zero-padded, so that names sort in arrival order."""
    return f"batch-{number:04d}.{file_format}"


def with_label_noise(table: pa.Table, fraction: float, seed: int = 0) -> pa.Table:
    """The table with `fraction` of its rows relabelled to another class: a deliberately degraded data set
    (a broken upstream labeller), on which a candidate should fail the registration gate."""
    if not 0.0 <= fraction <= 1.0:
        raise InputError(f"--label-noise {fraction}: expected a fraction of rows from 0 to 1")
    labels = table.column(DIGITS_SCHEMA.label_column).to_numpy().copy()
    classes = np.unique(labels)
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(labels), size=round(fraction * len(labels)), replace=False)
    # Shift by 1..n-1 classes, so that every chosen row really changes label.
    shifts = rng.integers(1, len(classes), size=len(chosen))
    labels[chosen] = classes[(np.searchsorted(classes, labels[chosen]) + shifts) % len(classes)]
    position = table.schema.get_field_index(DIGITS_SCHEMA.label_column)
    return table.set_column(position, DIGITS_SCHEMA.label_column, pa.array(labels))


def with_shift(table: pa.Table, strength: float) -> pa.Table:
    """The table with its images deliberately shifted, as a drifted camera or scanner would deliver them:
    a data set for the drift check, with the labels and row keys unchanged.

    With `strength` F from 0 to 1, each image moves right by 2F columns, then every pixel is brightened by
    the factor 1 + F and capped at 16; both round halves up (F = 0.25 moves one column). The columns that
    enter on the left are background, 0; those pushed off the right edge are lost. Pixels stay whole
    numbers from 0 to 16, the digits' valid range; F = 0 leaves the table as it is.
    """
    if isinstance(strength, bool) or not isinstance(strength, int | float) or not 0.0 <= strength <= 1.0:
        raise InputError(f"--shift {strength!r}: expected a strength from 0 to 1")
    columns = list(DIGITS_SCHEMA.feature_columns)
    pixels = np.column_stack([table.column(name).to_numpy() for name in columns]).astype(np.float64)
    images = pixels.reshape(-1, IMAGE_SIDE, IMAGE_SIDE)
    offset = int(np.floor(2 * strength + 0.5))
    moved = np.zeros_like(images)
    moved[:, :, offset:] = images[:, :, : IMAGE_SIDE - offset]
    brightened = np.minimum(np.floor(moved * (1.0 + strength) + 0.5), MAX_PIXEL).astype(np.int64)
    flat = brightened.reshape(len(pixels), -1)
    for position, name in enumerate(columns):
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(flat[:, position]))
    return table


def write_sample_batches(
    out: Path, *, batches: int = 4, file_format: str = "csv", label_noise: float = 0.0, shift: float = 0.0
) -> list[Path]:
    """Write the digits data set into `out` as `batches` raw files `batch-0001.<format>`, ...

    Consecutive batches overlap: each batch after the first starts with the last `OVERLAP_ROWS` rows of
    the batch before it, identical re-deliveries of the same records, as happens with real feeds.
    Each file appears atomically (written under a hidden temporary name, then renamed), so a watcher never
    sees a partial file. Existing batch files are never overwritten: that raises InputError. `label_noise`
    relabels a fraction of rows (`with_label_noise`); `shift` shifts and brightens the images
    (`with_shift`).
    """
    out = Path(out)
    if file_format not in FILE_FORMATS:
        raise InputError(
            f"file format {file_format!r} is not supported; expected one of {', '.join(FILE_FORMATS)}"
        )
    table = with_label_noise(digits_table(), label_noise) if label_noise else digits_table()
    table = with_shift(table, shift) if shift else table
    if isinstance(batches, bool) or not isinstance(batches, int) or not 1 <= batches <= table.num_rows:
        raise InputError(
            f"batches={batches!r} is out of range; expected a whole number from 1 to {table.num_rows} "
            "(the number of rows in the digits data set)"
        )
    paths = [out / batch_file_name(number, file_format) for number in range(1, batches + 1)]
    for path in paths:
        if path.exists():
            raise InputError(
                f"{path}: already exists; raw batch files are never overwritten, choose another --out"
            )
    out.mkdir(parents=True, exist_ok=True)
    for path, rows in zip(paths, batch_ranges(table.num_rows, batches), strict=True):
        write_batch_file(table.slice(rows.start, len(rows)), path, file_format)
    return paths


def write_batch_file(table: pa.Table, path: Path, file_format: str = "csv") -> None:
    """`table` as one raw batch file that appears at `path` whole: it is written under a hidden name (which
    neither a watcher nor `prepare` picks up) and renamed."""
    if file_format == "parquet":
        write_atomically(path, lambda handle: pq.write_table(table, handle))
    else:
        write_atomically(path, lambda handle: pa_csv.write_csv(table, handle))
