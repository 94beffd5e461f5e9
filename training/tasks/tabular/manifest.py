"""The manifest of a prepared tabular data version: the contract between `prepare`, which writes a version,
and `dataset` (training) and `drift`, which read it; both sides go through the readers here.

A version is a list of parts (training/tasks/tabular/parts.py) with this version's deletion vectors, and
the totals the next version continues from. Its data version is a hash of what defines the data: the
schema, the split configuration and each part's content and deletion vectors; never when or from which
earlier version it was made.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from core.errors import InputError
from training.data.splits import SPLIT_NAMES, SplitFractions, split_config
from training.data.versions import MANIFEST_NAME, check_split_document, content_version, parse_manifest
from training.tasks.tabular.parts import Part, Totals, live_tables
from training.tasks.tabular.schema import RERUN_HINT, TableSchema

# /2: each split also as memory-mappable shards. /3: parts and deletion vectors, shared between versions.
# /4: categorical and boolean features, missing values, class names, regression targets; vocabularies.
FORMAT = "retrain-prepared/4"


@dataclass(frozen=True)
class RawFileEntry:
    """One raw batch file a data version was built from."""

    name: str
    sha256: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class PrepStats:
    """Row counts: raw_rows = unique_rows + exact_duplicates + superseded.

    A dropped row is an exact duplicate when it equals the next delivery of its key, and superseded when
    that next delivery differs from it.
    """

    raw_rows: int
    unique_rows: int
    exact_duplicates: int
    superseded: int


@dataclass(frozen=True)
class Normalization:
    """Per-feature mean and standard deviation of the train split (population std, float64)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass(frozen=True)
class Manifest:
    """Everything known about one prepared data version; `data_version` is derived from its content."""

    schema: TableSchema
    split: SplitFractions
    raw_files: tuple[RawFileEntry, ...]
    part_rows: int
    parts: tuple[Part, ...]
    totals: Totals
    stats: PrepStats
    normalization: Normalization
    previous_version: str | None
    created_at: str
    # Each categorical column's categories, a shard code being a place in its list (encoding.py).
    vocabularies: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    format: str = FORMAT

    @property
    def data_version(self) -> str:
        """`dv-` + 16 hex digits over the content-defining fields only (not provenance or time)."""
        content = {
            "format": self.format,
            "schema": self.schema.to_dict(),
            "split": split_config(self.split),
            "part_rows": self.part_rows,
            "parts": [part.identity() for part in self.parts],
            "vocabularies": {name: list(values) for name, values in self.vocabularies.items()},
        }
        return content_version(content)

    def split_rows(self, name: str) -> int:
        """The live rows of split `name`."""
        index = _split_index(name)
        return sum(part.splits[index].live_rows for part in self.parts)

    def split_whole(self, name: str) -> tuple[bool, ...]:
        """Per feature, whether every row of split `name` holds a whole number (superseded rows included:
        a column is typed as whole only when no delivery of it was fractional)."""
        index = _split_index(name)
        width = len(self.schema.feature_columns or ())
        return tuple(all(part.splits[index].whole[column] for part in self.parts) for column in range(width))

    def to_json(self) -> str:
        document = {
            "format": self.format,
            "data_version": self.data_version,
            "previous_version": self.previous_version,
            "created_at": self.created_at,
            "schema": self.schema.to_dict(),
            "split": split_config(self.split),
            "splits": {
                name: {"rows": self.split_rows(name), "parts": len(self.parts)} for name in SPLIT_NAMES
            },
            "raw_files": [vars(entry) for entry in self.raw_files],
            "part_rows": self.part_rows,
            "parts": [part.to_dict() for part in self.parts],
            "totals": self.totals.to_dict(),
            "stats": vars(self.stats),
            "normalization": {"mean": list(self.normalization.mean), "std": list(self.normalization.std)},
            "vocabularies": {name: list(values) for name, values in self.vocabularies.items()},
        }
        return json.dumps(document, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "manifest") -> Manifest:
        return parse_manifest(text, source, _manifest_from_document, "data version manifest", RERUN_HINT)


def _split_index(name: str) -> int:
    if name not in SPLIT_NAMES:
        raise InputError(f"no split named {name!r}; expected one of {', '.join(SPLIT_NAMES)}")
    return SPLIT_NAMES.index(name)


def _manifest_from_document(document: dict[str, Any]) -> Manifest:
    if document["format"] != FORMAT:
        raise ValueError(f"format {document['format']!r} is not {FORMAT!r}")
    split = document["split"]
    check_split_document(split, document["splits"])
    schema = TableSchema.from_dict(document["schema"])
    if not schema.is_resolved:
        raise ValueError("its schema leaves the feature columns or the class count open")
    return Manifest(
        schema=schema,
        split=SplitFractions(**split["fractions"]),
        raw_files=tuple(RawFileEntry(**entry) for entry in document["raw_files"]),
        part_rows=int(document["part_rows"]),
        parts=tuple(Part.from_dict(part) for part in document["parts"]),
        totals=Totals.from_dict(document["totals"]),
        stats=PrepStats(**document["stats"]),
        normalization=Normalization(
            mean=tuple(float(value) for value in document["normalization"]["mean"]),
            std=tuple(float(value) for value in document["normalization"]["std"]),
        ),
        previous_version=document["previous_version"],
        created_at=document["created_at"],
        vocabularies={
            str(name): tuple(map(str, values)) for name, values in document["vocabularies"].items()
        },
    )


def read_manifest(data_dir: Path) -> Manifest:
    """The manifest of a prepared data version folder."""
    path = data_dir / MANIFEST_NAME
    if not path.is_file():
        raise InputError(
            f"{data_dir}: no {MANIFEST_NAME}, so it is not a prepared data version; {RERUN_HINT}"
        )
    return Manifest.from_json(path.read_text(encoding="utf-8"), source=str(path))


def read_split_table(data_dir: Path, manifest: Manifest, name: str) -> pa.Table:
    """One split's live rows as one table, every file checked against the manifest: the whole split in
    memory, for small data and inspection (`live_tables` reads a part at a time)."""
    tables = list(live_tables(data_dir, manifest.parts, _split_index(name)))
    return pa.concat_tables(tables) if tables else manifest.schema.prepared_arrow_schema().empty_table()
