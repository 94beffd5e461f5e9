"""The shapes of the data: the raw table's columns, the split configuration, and the manifest of a
prepared data version.

The manifest is the contract between `training.tasks.tabular.prepare`, which writes a data version, and
`training.tasks.tabular.dataset`, which loads it for the trainer; both sides go through the readers here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.data.splits import SPLIT_METHOD, SPLIT_NAMES, SPLIT_SALT, SplitFractions, split_config
from training.errors import InputError

FORMAT = "retrain-prepared/1"
MANIFEST_NAME = "manifest.json"
SOURCE_FILE_COLUMN = "source_file"
SOURCE_ROW_COLUMN = "source_row"
RERUN_HINT = "re-run `retrain prepare` to write a fresh data version"


@dataclass(frozen=True)
class TableSchema:
    """The columns of a raw batch: one key, one integer class label, and numeric features."""

    key_column: str
    label_column: str
    feature_columns: tuple[str, ...]
    n_classes: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_columns", tuple(self.feature_columns))
        if not self.feature_columns:
            raise InputError("a table schema needs at least one feature column; list them in feature_columns")
        for name in self.columns:
            if not isinstance(name, str) or not name.strip():
                raise InputError(f"schema column names must be non-empty strings; got {name!r}")
        seen: set[str] = set()
        for name in self.columns:
            if name in seen:
                raise InputError(f"the schema names column {name!r} twice; give every column a distinct name")
            seen.add(name)
        for name in (SOURCE_FILE_COLUMN, SOURCE_ROW_COLUMN):
            if name in seen:
                raise InputError(f"column name {name!r} is reserved for provenance; rename that column")
        if isinstance(self.n_classes, bool) or not isinstance(self.n_classes, int) or self.n_classes < 2:
            raise InputError(f"n_classes must be an integer of at least 2; got {self.n_classes!r}")

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.key_column, self.label_column, *self.feature_columns)

    def describe_columns(self) -> str:
        """A short human form of the expected columns, for error messages."""
        features = self.feature_columns
        shown = ", ".join(features) if len(features) <= 3 else f"{features[0]}..{features[-1]}"
        return f"{self.key_column}, {self.label_column}, {shown} (any order)"

    def prepared_arrow_schema(self) -> pa.Schema:
        """Column types of a prepared split file: features as float64 so raw values survive exactly."""
        return pa.schema(
            [
                pa.field(self.key_column, pa.string()),
                pa.field(self.label_column, pa.int64()),
                *(pa.field(name, pa.float64()) for name in self.feature_columns),
                pa.field(SOURCE_FILE_COLUMN, pa.string()),
                pa.field(SOURCE_ROW_COLUMN, pa.int64()),
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "key_column": self.key_column,
            "label_column": self.label_column,
            "feature_columns": list(self.feature_columns),
            "n_classes": self.n_classes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TableSchema:
        return cls(
            data["key_column"], data["label_column"], tuple(data["feature_columns"]), data["n_classes"]
        )


DIGITS_SCHEMA = TableSchema(
    key_column="row_key",
    label_column="label",
    feature_columns=tuple(f"pixel_{index}" for index in range(64)),
    n_classes=10,
)


@dataclass(frozen=True)
class RawFileEntry:
    """One raw batch file a data version was built from."""

    name: str
    sha256: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class SplitEntry:
    """One prepared split file; `content_sha256` hashes the rows, `file_sha256` the Parquet bytes."""

    name: str
    file: str
    rows: int
    file_sha256: str
    content_sha256: str


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
    splits: tuple[SplitEntry, ...]
    stats: PrepStats
    normalization: Normalization
    previous_version: str | None
    created_at: str
    format: str = FORMAT

    @property
    def data_version(self) -> str:
        """`dv-` + 16 hex digits over the content-defining fields only (not provenance or time)."""
        content = {
            "format": self.format,
            "schema": self.schema.to_dict(),
            "split": split_config(self.split),
            "splits": {entry.name: entry.content_sha256 for entry in self.splits},
        }
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return "dv-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def split_entry(self, name: str) -> SplitEntry:
        for entry in self.splits:
            if entry.name == name:
                return entry
        raise InputError(f"no split named {name!r}; expected one of {', '.join(SPLIT_NAMES)}")

    def to_json(self) -> str:
        document = {
            "format": self.format,
            "data_version": self.data_version,
            "previous_version": self.previous_version,
            "created_at": self.created_at,
            "schema": self.schema.to_dict(),
            "split": split_config(self.split),
            "raw_files": [vars(entry) for entry in self.raw_files],
            "splits": {entry.name: _without_name(entry) for entry in self.splits},
            "stats": vars(self.stats),
            "normalization": {"mean": list(self.normalization.mean), "std": list(self.normalization.std)},
        }
        return json.dumps(document, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "manifest") -> Manifest:
        try:
            document = json.loads(text)
            manifest = _manifest_from_document(document)
            stored_version = document["data_version"]
        except (ValueError, KeyError, TypeError, AttributeError, InputError) as error:
            raise InputError(
                f"{source}: not a readable data version manifest ({error}); {RERUN_HINT}"
            ) from error
        if stored_version != manifest.data_version:
            raise InputError(
                f"{source}: says data version {stored_version} but its content gives "
                f"{manifest.data_version}; the manifest was edited. {RERUN_HINT}"
            )
        return manifest


def _without_name(entry: SplitEntry) -> dict[str, Any]:
    return {key: value for key, value in vars(entry).items() if key != "name"}


def _manifest_from_document(document: dict[str, Any]) -> Manifest:
    if document["format"] != FORMAT:
        raise ValueError(f"format {document['format']!r} is not {FORMAT!r}")
    split = document["split"]
    if split["method"] != SPLIT_METHOD or split["salt"] != SPLIT_SALT:
        raise ValueError("unknown split method or salt")
    splits = document["splits"]
    if list(splits) != list(SPLIT_NAMES):
        raise ValueError(f"splits are {list(splits)}, expected {list(SPLIT_NAMES)}")
    return Manifest(
        schema=TableSchema.from_dict(document["schema"]),
        split=SplitFractions(**split["fractions"]),
        raw_files=tuple(RawFileEntry(**entry) for entry in document["raw_files"]),
        splits=tuple(SplitEntry(name=name, **splits[name]) for name in SPLIT_NAMES),
        stats=PrepStats(**document["stats"]),
        normalization=Normalization(
            mean=tuple(float(value) for value in document["normalization"]["mean"]),
            std=tuple(float(value) for value in document["normalization"]["std"]),
        ),
        previous_version=document["previous_version"],
        created_at=document["created_at"],
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
    """One split's rows, after checking the file is byte for byte the one the manifest names."""
    entry = manifest.split_entry(name)
    path = data_dir / entry.file
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(f"{path}: cannot read the {name} split ({error.strerror}); {RERUN_HINT}") from error
    if hashlib.sha256(data).hexdigest() != entry.file_sha256:
        raise InputError(f"{path}: sha256 differs from the manifest, the file was changed; {RERUN_HINT}")
    table = pq.read_table(pa.BufferReader(data))
    expected = manifest.schema.prepared_arrow_schema()
    if table.schema.remove_metadata() != expected:
        raise InputError(f"{path}: columns differ from the manifest's schema; {RERUN_HINT}")
    return table


def feature_matrix(table: pa.Table, schema: TableSchema) -> np.ndarray:
    """The feature columns as one float64 [rows, features] array, in the schema's column order."""
    if table.num_rows == 0:
        return np.zeros((0, len(schema.feature_columns)), dtype=np.float64)
    columns = [
        table.column(name).to_numpy().astype(np.float64, copy=False) for name in schema.feature_columns
    ]
    return np.column_stack(columns)
