"""Parts: a prepared data version as immutable pieces, each one chunk of one raw file, plus the rows later
deliveries superseded in them.

A part is up to `part_rows` consecutive data rows of one raw file, deduplicated within itself (the last
delivery of a key wins) and split by key hash. Its files never change once written: for each split, the
rows as Parquet (every column, values exact) and as an array shard (training/data/shards.py); and its key
index, the sorted 16-byte digests of its keys with, for each, its row's digest and its place. What later
parts supersede in it is recorded beside it, per version, as the sorted positions of its dead rows: a
deletion vector, as Delta Lake and Iceberg keep them. A version is its parts and their deletion vectors, so
the next version shares every part of this one, reads only the new raw files, and writes their parts and
the deletion vectors they change.

training/tasks/tabular/folding.py builds them.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.files import check_file_sha256, checked_bytes
from training.data.shards import Shard
from training.data.splits import SPLIT_NAMES
from training.tasks.tabular.schema import RERUN_HINT, TableSchema

PART_BYTES = 64 << 20  # a part's rows as float64 values: prepare holds a few parts' worth at most
_MIN_PART_ROWS = 1024
_PART_TAG = b"retrain-part/1\n"
_KEY_TAG = b"retrain-key/1\n"
PLACES = np.dtype([("row", "S16"), ("split", "u1"), ("at", "<i8")])
TRAIN = SPLIT_NAMES.index("train")


def part_rows(schema: TableSchema) -> int:
    """Rows per part for this table: `PART_BYTES` of float64 values, with room for key and provenance."""
    width = 8 * (len(schema.feature_columns or ()) + 2) + 64
    return max(_MIN_PART_ROWS, PART_BYTES // width)


def part_id(raw_name: str, raw_sha256: str, chunk: int, rows: int) -> str:
    """A part's name: what it is made of (which raw file, which of its chunks), never when it was made."""
    digest = hashlib.sha256(_PART_TAG + f"{raw_name}\0{raw_sha256}\0{chunk}\0{rows}".encode())
    return "p-" + digest.hexdigest()[:20]


def key_digests(keys: Sequence[str]) -> np.ndarray:
    """16 bytes per key (`S16`): 128 bits, so that distinct keys sharing one is as likely as a
    content-addressed store's collision, and the index stays a sorted array a search can map."""
    tagged = hashlib.sha256(_KEY_TAG)
    out = []
    for key in keys:
        digest = tagged.copy()
        digest.update(key.encode())
        out.append(digest.digest()[:16])
    return np.array(out, dtype="S16")


@dataclass(frozen=True)
class PartSplit:
    """One split of one part: its Parquet file, its shard, which features hold only whole numbers in it, and
    the deletion vector of this version (`dead`, None while no row of it is superseded)."""

    file: str
    file_sha256: str
    shard: Shard
    whole: tuple[bool, ...]
    dead: str | None = None
    dead_sha256: str | None = None
    dead_rows: int = 0

    @property
    def live_rows(self) -> int:
        return self.shard.rows - self.dead_rows

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "shard": self.shard.to_dict(), "whole": list(self.whole)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PartSplit:
        return cls(
            file=str(data["file"]),
            file_sha256=str(data["file_sha256"]),
            shard=Shard.from_dict(data["shard"]),
            whole=tuple(bool(flag) for flag in data["whole"]),
            dead=None if data["dead"] is None else str(data["dead"]),
            dead_sha256=None if data["dead_sha256"] is None else str(data["dead_sha256"]),
            dead_rows=int(data["dead_rows"]),
        )


@dataclass(frozen=True)
class Part:
    """One chunk of one raw file as prepared: `rows` data rows were read, its key index (`keys`, the sorted
    key digests, and `places`, each one's row digest, split and position) and one entry per split."""

    id: str
    raw_file: str
    chunk: int
    rows: int
    keys: str
    keys_sha256: str
    places: str
    places_sha256: str
    splits: tuple[PartSplit, ...]

    def files(self) -> dict[str, str]:
        """Every file of the part and its sha256 (deletion vectors excluded: they belong to a version)."""
        named = {self.keys: self.keys_sha256, self.places: self.places_sha256}
        for entry in self.splits:
            named[entry.file] = entry.file_sha256
            named[entry.shard.inputs] = entry.shard.inputs_sha256
            named[entry.shard.targets] = entry.shard.targets_sha256
        return named

    def identity(self) -> list[Any]:
        """What makes this part of this version what it is, for the data version's hash: its rows (keys,
        inputs, targets) and dead rows; not which raw file they came from, so the same rows in the same
        batches give the same version, whatever the files' names or format."""
        return [
            self.keys_sha256,
            [
                [entry.shard.inputs_sha256, entry.shard.targets_sha256, entry.dead_sha256]
                for entry in self.splits
            ],
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            **vars(self),
            "splits": {name: entry.to_dict() for name, entry in zip(SPLIT_NAMES, self.splits, strict=True)},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Part:
        splits = data["splits"]
        if list(splits) != list(SPLIT_NAMES):
            raise ValueError(f"a part's splits are {list(splits)}, expected {list(SPLIT_NAMES)}")
        return cls(
            id=str(data["id"]),
            raw_file=str(data["raw_file"]),
            chunk=int(data["chunk"]),
            rows=int(data["rows"]),
            keys=str(data["keys"]),
            keys_sha256=str(data["keys_sha256"]),
            places=str(data["places"]),
            places_sha256=str(data["places_sha256"]),
            splits=tuple(PartSplit.from_dict(splits[name]) for name in SPLIT_NAMES),
        )


@dataclass(frozen=True)
class Totals:
    """What a version's live rows add up to, kept in its manifest so that the next version continues from
    it. Of the train rows: their count; per feature the present values' count, sums and sums of squares
    (of the float32 values training sees, less `shift` so that a feature far from zero keeps its
    precision); per categorical feature each code's rows (`categories`, in the order of the categorical
    columns); and for a regression, the target's shift, sum and sum of squares (`target`). Of every split:
    the label counts (a classification's) and per feature the missing values. And the rows dropped so far
    as exact duplicates and as superseded."""

    train_rows: int
    shift: tuple[float, ...]
    sums: tuple[float, ...]
    squares: tuple[float, ...]
    counts: tuple[int, ...]
    missing: tuple[int, ...]
    categories: tuple[tuple[int, ...], ...]
    target: tuple[float, ...]
    labels: tuple[tuple[int, int], ...]
    exact_duplicates: int
    superseded: int

    def to_dict(self) -> dict[str, Any]:
        arrays = {
            name: list(getattr(self, name)) for name in ("shift", "sums", "squares", "counts", "missing")
        }
        return {
            **vars(self),
            **arrays,
            "categories": [list(counts) for counts in self.categories],
            "target": list(self.target),
            "labels": [list(pair) for pair in self.labels],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Totals:
        return cls(
            train_rows=int(data["train_rows"]),
            shift=tuple(float(value) for value in data["shift"]),
            sums=tuple(float(value) for value in data["sums"]),
            squares=tuple(float(value) for value in data["squares"]),
            counts=tuple(int(value) for value in data["counts"]),
            missing=tuple(int(value) for value in data["missing"]),
            categories=tuple(tuple(int(value) for value in counts) for counts in data["categories"]),
            target=tuple(float(value) for value in data["target"]),
            labels=tuple((int(label), int(count)) for label, count in data["labels"]),
            exact_duplicates=int(data["exact_duplicates"]),
            superseded=int(data["superseded"]),
        )

    def mean_std(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-feature mean and population std of the live train rows' present values (0 and 0 for a
        feature with none)."""
        return _moments(
            np.array(self.counts), np.array(self.shift), np.array(self.sums), np.array(self.squares)
        )

    def target_mean_std(self) -> tuple[float, float]:
        """A regression target's mean and population std over the live train rows."""
        shift, total, squares = self.target
        mean, std = _moments(
            np.array([self.train_rows]), np.array([shift]), np.array([total]), np.array([squares])
        )
        return mean[0], std[0]


def _moments(
    counts: np.ndarray, shift: np.ndarray, sums: np.ndarray, squares: np.ndarray
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    count = np.maximum(counts, 1)
    mean = sums / count
    variance = np.maximum(squares / count - mean * mean, 0.0)
    mean = np.where(counts > 0, mean + shift, 0.0)
    return tuple(float(v) for v in mean), tuple(float(v) for v in np.sqrt(variance))


def read_dead(folder: Path, entry: PartSplit) -> np.ndarray:
    """A split's deletion vector, checked against its sha256."""
    data = checked_bytes(folder / str(entry.dead), str(entry.dead_sha256), "deletion vector", RERUN_HINT)
    return np.load(io.BytesIO(data), allow_pickle=False).astype(np.int64)


def check_files(folder: Path, parts: Sequence[Part]) -> None:
    """Every file of `parts` in `folder` is byte for byte the one recorded (read in chunks), or InputError
    naming the first that is not: a version builds only on parts that are what they say."""
    for part in parts:
        for name, expected in part.files().items():
            check_file_sha256(folder / name, expected)


def live_tables(folder: Path, parts: Sequence[Part], split: int) -> Iterator[pa.Table]:
    """Each part's live rows of one split, as a table, in part order (one part held at a time)."""
    for part in parts:
        entry = part.splits[split]
        data = checked_bytes(folder / entry.file, entry.file_sha256, hint=RERUN_HINT)
        # ParquetFile reads on this thread: `pq.read_table`'s async threads could drop the last reference
        # to `data` at interpreter exit and abort the process after its work was done.
        with pq.ParquetFile(pa.BufferReader(data)) as parquet:
            table = parquet.read(use_threads=False)
        if entry.dead is not None:
            keep = np.ones(table.num_rows, dtype=bool)
            keep[read_dead(folder, entry)] = False
            table = table.filter(pa.array(keep))
        yield table
