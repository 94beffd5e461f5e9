"""Folding raw chunks into parts: the one operation that builds a prepared version.

Adding a part (`Folding.add`) is the same whether a full preparation adds every part or an incremental one
continues from a previous version's state (`Folding.from_version`): so both reach the same files and the
same numbers, float for float. Superseding a key searches each earlier part's sorted key index through a
memory map, so an addition costs its own rows and the index pages they touch, never the history's rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.data.shards import Shard, split_shards
from training.data.splits import SPLIT_NAMES, SplitFractions, assign_splits
from training.data.whole_numbers import whole_columns
from training.tasks.tabular.dedupe import deduplicate
from training.tasks.tabular.encoding import Vocabulary, distinct_text, encode
from training.tasks.tabular.manifest import Manifest
from training.tasks.tabular.parts import (
    PLACES,
    TRAIN,
    Part,
    PartSplit,
    Totals,
    key_digests,
    part_id,
    read_dead,
)
from training.tasks.tabular.schema import CATEGORICAL, LABEL_NAME, LABEL_NUMBER, NUMERIC, TableSchema


class Folding:
    """A version being built: its parts so far, where their files lie, their deletion vectors, totals and
    vocabularies.

    Start empty (a full preparation) or `from_version` (an incremental one), then `add` each chunk of the new
    raw files in order. Part files are written into `scratch`; earlier ones are read where they lie."""

    def __init__(self, schema: TableSchema, fractions: SplitFractions, scratch: Path) -> None:
        self.schema, self.fractions, self.scratch = schema, fractions, scratch
        self.parts: list[Part] = []
        self.folder: dict[str, Path] = {}  # part id -> the folder its files lie in
        self.dead: dict[tuple[str, int], np.ndarray] = {}  # (part id, split) -> sorted dead positions
        width = len(schema.feature_columns or ())
        self.train_rows = 0
        self.shift = np.full(width, np.nan)  # each feature's first present train value, once there is one
        self.sums, self.squares = np.zeros(width), np.zeros(width)
        self.counts, self.missing = np.zeros(width, np.int64), np.zeros(width, np.int64)
        self.target = np.array([np.nan, 0.0, 0.0])  # a regression target's shift, sum, sum of squares
        self.labels: dict[int, int] = {}
        self.exact = self.superseded = 0
        self.categorical = [
            position
            for position, name in enumerate(schema.feature_columns or ())
            if schema.feature_type(name) == CATEGORICAL
        ]
        self.vocabularies = {
            name: Vocabulary(limit=schema.max_categories) for name in schema.columns_of(CATEGORICAL)
        }
        self.category_counts = [np.zeros(0, np.int64) for _ in self.categorical]
        # Class names found in a label of names (`LABEL_NAME`); declared classes are indices when read.
        self.classes = Vocabulary(schema.classes or ())

    @classmethod
    def from_version(cls, folder: Path, manifest: Manifest, schema: TableSchema, scratch: Path) -> Folding:
        """Continue from the prepared version `manifest` in `folder`: its parts, their deletion vectors (each
        checked against its sha256), its totals and its vocabularies."""
        folding = cls(schema, manifest.split, scratch)
        folding.parts = list(manifest.parts)
        for part in manifest.parts:
            folding.folder[part.id] = folder
            for index, entry in enumerate(part.splits):
                if entry.dead is not None:
                    folding.dead[(part.id, index)] = read_dead(folder, entry)
        totals = manifest.totals
        folding.train_rows = totals.train_rows
        folding.shift = np.array(totals.shift)
        folding.sums, folding.squares = np.array(totals.sums), np.array(totals.squares)
        folding.counts, folding.missing = (
            np.array(totals.counts, np.int64),
            np.array(totals.missing, np.int64),
        )
        folding.target = np.array(totals.target) if totals.target else folding.target
        folding.category_counts = [np.array(counts, np.int64) for counts in totals.categories]
        folding.labels = dict(totals.labels)
        folding.exact, folding.superseded = totals.exact_duplicates, totals.superseded
        for name, values in manifest.vocabularies.items():
            folding.vocabularies[name] = Vocabulary(values, limit=schema.max_categories)
        if schema.label_kind == LABEL_NAME:
            folding.classes = Vocabulary(manifest.schema.classes or ())
        return folding

    def add(self, chunk: pa.Table, raw_name: str, raw_sha256: str, number: int, rows: int) -> None:
        """Add chunk `number` of raw file `raw_name` (validated rows): the rows it supersedes in earlier
        parts die, then its own rows, one per key, join."""
        unique = deduplicate(chunk, self.schema)
        self.exact += unique.exact_duplicates
        self.superseded += unique.superseded
        table = unique.table
        keys = key_digests(table.column(self.schema.key_field).to_pylist())
        for name, vocabulary in self.vocabularies.items():
            vocabulary.grow(distinct_text(table.column(name)))
        features = encode(table, self.schema, self.vocabularies)
        targets = self._targets(table)
        order = np.argsort(keys, kind="stable")
        self._supersede(keys[order], unique.first_digests[order])
        identifier = part_id(raw_name, raw_sha256, number, rows)
        written = self._write(identifier, table, keys, unique.digests, features, targets)
        self.parts.append(Part(identifier, raw_name, number, chunk.num_rows, *written))

    def _targets(self, table: pa.Table) -> np.ndarray:
        """The label column as a shard holds it: class indices (int64), or a regression's numbers."""
        column = table.column(self.schema.label_column)
        if self.schema.label_kind == LABEL_NUMBER:
            return column.to_numpy().astype(np.float32)
        if self.schema.label_kind == LABEL_NAME:
            self.classes.grow(distinct_text(column))
            return self.classes.codes(column).astype(np.int64)
        return column.to_numpy().astype(np.int64)

    def _supersede(self, keys: np.ndarray, digests: np.ndarray) -> None:
        """Kill the live earlier delivery of every key in `keys` (sorted), counting it an exact duplicate when
        its row digest is the key's next delivery's (`digests`, the chunk's first of each key): one search
        per earlier part's mapped index, so the cost is the new keys' and the index pages they touch, not
        the history's."""
        if not len(keys):
            return
        for part in self.parts:
            folder = self.folder[part.id]
            index = np.load(folder / part.keys, mmap_mode="r")
            if not len(index):
                continue
            at = np.minimum(np.searchsorted(index, keys), len(index) - 1)
            hit = index[at] == keys
            if not hit.any():
                continue
            places = np.load(folder / part.places, mmap_mode="r")[at[hit]]
            new_digests = digests[hit]
            for split in range(len(SPLIT_NAMES)):
                mine = places["split"] == split
                dead = self.dead.get((part.id, split), np.zeros(0, np.int64))
                fresh = mine & ~np.isin(places["at"], dead)
                if not fresh.any():
                    continue
                positions = places["at"][fresh].astype(np.int64)
                exact = int(np.count_nonzero(places["row"][fresh] == new_digests[fresh]))
                self.exact += exact
                self.superseded += len(positions) - exact
                self.dead[(part.id, split)] = np.union1d(dead, positions)
                self._forget(folder, part.splits[split].shard, split, np.sort(positions))

    def _forget(self, folder: Path, shard: Shard, split: int, positions: np.ndarray) -> None:
        """Take dead rows out of the totals, reading only those rows of the part's shard."""
        targets = np.load(folder / shard.targets, mmap_mode="r")[positions]
        inputs = np.load(folder / shard.inputs, mmap_mode="r")[positions].astype(np.float64)
        self._count(split, inputs, targets, -1)

    def _write(
        self, identifier: str, table: pa.Table, keys: np.ndarray, digests: np.ndarray, features: np.ndarray,
        targets: np.ndarray,
    ) -> tuple[str, str, str, str, tuple[PartSplit, ...]]:  # fmt: skip
        """Write a part's files into `scratch`: per split its Parquet and shard, then its key index; return
        the index's names and sha256s and the split entries."""
        assignment = assign_splits(table.column(self.schema.key_field).to_pylist(), self.fractions)
        entries, at = [], np.zeros(len(keys), dtype=np.int64)
        for split, name in enumerate(SPLIT_NAMES):
            chosen = assignment == split
            at[chosen] = np.arange(int(np.count_nonzero(chosen)))
            inputs = features[chosen].astype(np.float32)
            files, shards = split_shards(f"{identifier}.{name}", inputs, targets[chosen], shard_bytes=1 << 62)
            for file_name, data in files.items():
                (self.scratch / file_name).write_bytes(data)
            parquet = f"{identifier}.{name}.parquet"
            sink = pa.BufferOutputStream()
            pq.write_table(table.filter(pa.array(chosen)).combine_chunks(), sink)
            payload = sink.getvalue().to_pybytes()
            (self.scratch / parquet).write_bytes(payload)
            digest = hashlib.sha256(payload).hexdigest()
            whole = whole_columns(features[chosen]) & self.numeric
            entries.append(PartSplit(parquet, digest, shards[0], tuple(bool(v) for v in whole)))
            self._count(split, inputs.astype(np.float64), targets[chosen], +1)
        order = np.argsort(keys, kind="stable")
        places = np.zeros(len(keys), dtype=PLACES)
        places["row"], places["split"], places["at"] = digests[order], assignment[order], at[order]
        names = (f"{identifier}.keys.npy", f"{identifier}.places.npy")
        shas = tuple(
            self._save(name, array) for name, array in zip(names, (keys[order], places), strict=True)
        )
        self.folder[identifier] = self.scratch
        return names[0], shas[0], names[1], shas[1], tuple(entries)

    @property
    def numeric(self) -> np.ndarray:
        """Per feature, whether it is numeric (the ones whose whole numbers a served table types)."""
        return np.array(
            [self.schema.feature_type(name) == NUMERIC for name in self.schema.feature_columns or ()]
        )

    def _count(self, split: int, inputs: np.ndarray, targets: np.ndarray, sign: int) -> None:
        """Add (`sign` +1) or take out (-1) rows of one split: their model inputs and targets."""
        self.missing += sign * np.isnan(inputs).sum(axis=0)
        if self.schema.label_kind != LABEL_NUMBER:
            for label, count in zip(*np.unique(targets, return_counts=True), strict=True):
                self.labels[int(label)] = self.labels.get(int(label), 0) + sign * int(count)
                if not self.labels[int(label)]:
                    del self.labels[int(label)]
        if split != TRAIN or not len(inputs):
            return
        self.train_rows += sign * len(inputs)
        present = ~np.isnan(inputs)
        fresh = (self.counts == 0) & present.any(axis=0)  # a feature's first present value is its shift
        if sign > 0 and fresh.any():
            first = np.argmax(present, axis=0)
            self.shift[fresh] = inputs[first[fresh], np.flatnonzero(fresh)]
        values = np.where(present, inputs - self.shift, 0.0)
        self.counts += sign * present.sum(axis=0)
        self.sums += sign * values.sum(axis=0)
        self.squares += sign * (values * values).sum(axis=0)
        for slot, position in enumerate(self.categorical):
            codes = inputs[:, position]
            codes = codes[codes >= 0].astype(np.int64)  # present and held by the vocabulary
            counts = np.bincount(codes, minlength=len(self.category_counts[slot]))
            grown = np.zeros(max(len(counts), len(self.category_counts[slot])), np.int64)
            grown[: len(self.category_counts[slot])] = self.category_counts[slot]
            grown[: len(counts)] += sign * counts
            self.category_counts[slot] = grown
        if self.schema.label_kind == LABEL_NUMBER:
            values = targets.astype(np.float64)
            if sign > 0 and np.isnan(self.target[0]):
                self.target[0] = values[0]
            values = values - self.target[0]
            self.target[1:] += sign * np.array([values.sum(), (values * values).sum()])

    def _save(self, name: str, array: np.ndarray) -> str:
        stream = io.BytesIO()
        np.save(stream, array, allow_pickle=False)
        (self.scratch / name).write_bytes(stream.getvalue())
        return hashlib.sha256(stream.getvalue()).hexdigest()

    def finished_parts(self) -> tuple[list[Part], dict[str, bytes]]:
        """The parts with this version's deletion vectors, and those vectors' files by name."""
        parts, files = [], {}
        for part in self.parts:
            entries = []
            for split, entry in enumerate(part.splits):
                dead = self.dead.get((part.id, split))
                if dead is None or not len(dead):
                    entries.append(dataclasses.replace(entry, dead=None, dead_sha256=None, dead_rows=0))
                    continue
                stream = io.BytesIO()
                np.save(stream, dead.astype("<i8"), allow_pickle=False)
                name = f"{part.id}.{SPLIT_NAMES[split]}.dead.npy"
                files[name] = stream.getvalue()
                sha = hashlib.sha256(files[name]).hexdigest()
                entries.append(
                    PartSplit(entry.file, entry.file_sha256, entry.shard, entry.whole, name, sha, len(dead))
                )
            parts.append(dataclasses.replace(part, splits=tuple(entries)))
        return parts, files

    def totals(self) -> Totals:
        return Totals(
            train_rows=self.train_rows,
            shift=tuple(float(v) for v in np.nan_to_num(self.shift)),
            sums=tuple(float(v) for v in self.sums),
            squares=tuple(float(v) for v in self.squares),
            counts=tuple(int(v) for v in self.counts),
            missing=tuple(int(v) for v in self.missing),
            categories=tuple(tuple(int(v) for v in counts) for counts in self.category_counts),
            target=tuple(float(v) for v in np.nan_to_num(self.target)) if self.schema.is_regression else (),
            labels=tuple(sorted(self.labels.items())),
            exact_duplicates=self.exact,
            superseded=self.superseded,
        )

    def vocabulary_values(self) -> dict[str, tuple[str, ...]]:
        """Each categorical column's vocabulary as this version fixes it."""
        return {name: tuple(vocabulary.values) for name, vocabulary in self.vocabularies.items()}
