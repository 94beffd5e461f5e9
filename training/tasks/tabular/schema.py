"""The shape of the data: the raw table's columns and what they mean (the manifest of a prepared version is
training/tasks/tabular/manifest.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from core.errors import InputError
from core.text import escaped

SOURCE_FILE_COLUMN = "source_file"
SOURCE_ROW_COLUMN = "source_row"
# The key of a row in a table without a key column: a hash of its label and feature values.
DERIVED_KEY_COLUMN = "derived_key"
RERUN_HINT = "re-run `retrain prepare` to write a fresh data version"


@dataclass(frozen=True)
class TableSchema:
    """The columns of a raw batch: an optional key, one integer class label, and numeric features.

    The tabular task's options build one. Two parts may be left open and are fixed when a data version is
    prepared (and recorded in its manifest): `feature_columns=None` means every column of the first raw
    file but the key and the label, in file order; `n_classes=None` means the largest label + 1. With
    `key_column=None` a row's key is derived from its content (`DERIVED_KEY_COLUMN`), so exact duplicates
    still collapse and a row's split is stable. With `classes` (class names), the label column may hold
    those names as text; each becomes its index.
    """

    key_column: str | None
    label_column: str
    feature_columns: tuple[str, ...] | None
    n_classes: int | None
    classes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_column", self.key_column or None)
        if self.feature_columns is not None:
            if isinstance(self.feature_columns, str):
                raise InputError(f"feature_columns {self.feature_columns!r}: expected a list of column names")
            object.__setattr__(self, "feature_columns", tuple(self.feature_columns))
            if not self.feature_columns:
                raise InputError(
                    "a table schema needs at least one feature column; list them in feature_columns"
                )
        self._check_classes()
        for name in self.named_columns:
            if not isinstance(name, str) or not name.strip():
                raise InputError(f"schema column names must be non-empty strings; got {name!r}")
        seen: set[str] = set()
        for name in self.named_columns:
            if name in seen:
                raise InputError(f"the schema names column {name!r} twice; give every column a distinct name")
            seen.add(name)
        derived = () if self.key_column else (DERIVED_KEY_COLUMN,)
        reserved = (SOURCE_FILE_COLUMN, SOURCE_ROW_COLUMN, *derived)
        for name in reserved:
            if name in seen:
                raise InputError(f"column name {name!r} is reserved for provenance; rename that column")

    def _check_classes(self) -> None:
        if self.classes is not None:
            if isinstance(self.classes, str) or not all(
                isinstance(name, str) and name.strip() for name in self.classes
            ):
                raise InputError(f"classes {self.classes!r}: expected a list of class names (non-empty text)")
            object.__setattr__(self, "classes", tuple(self.classes))
            if len(set(self.classes)) != len(self.classes):
                raise InputError(f"classes {list(self.classes)}: a class name appears twice")
            if self.n_classes is None:
                object.__setattr__(self, "n_classes", len(self.classes))
            elif self.n_classes != len(self.classes):
                raise InputError(
                    f"n_classes {self.n_classes} but {len(self.classes)} classes are named; "
                    "give one of the two, or make them agree"
                )
        if self.n_classes is not None and (
            isinstance(self.n_classes, bool) or not isinstance(self.n_classes, int) or self.n_classes < 2
        ):
            raise InputError(f"n_classes must be an integer of at least 2; got {self.n_classes!r}")

    @property
    def named_columns(self) -> tuple[str, ...]:
        """The column names this schema states (the feature columns only once they are known)."""
        key = (self.key_column,) if self.key_column else ()
        return (*key, self.label_column, *(self.feature_columns or ()))

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns a raw batch holds; only for a schema whose feature columns are known."""
        return self.named_columns

    @property
    def key_field(self) -> str:
        """The key column of a prepared split: the raw key column, or the derived key."""
        return self.key_column or DERIVED_KEY_COLUMN

    @property
    def is_resolved(self) -> bool:
        return self.feature_columns is not None and self.n_classes is not None

    def with_features_from(self, header: list[str]) -> TableSchema:
        """This schema with open feature columns taken from a raw file's header: every column but the
        key and the label, in file order."""
        if self.feature_columns is not None:
            return self
        features = tuple(name for name in header if name not in (self.key_column, self.label_column))
        if not features:
            raise InputError(
                f"the raw files have no columns besides {escaped(', '.join(self.named_columns))}; expected "
                "numeric feature columns"
            )
        return dataclasses.replace(self, feature_columns=features)

    def accepts(self, prepared: TableSchema) -> bool:
        """Whether a data version prepared with `prepared` is what this (possibly open) schema describes."""
        return (
            self.key_column == prepared.key_column
            and self.label_column == prepared.label_column
            and self.classes == prepared.classes
            and self.feature_columns in (None, prepared.feature_columns)
            and self.n_classes in (None, prepared.n_classes)
        )

    def describe_columns(self) -> str:
        """A short human form of the expected columns, for error messages (escaped: names come from data)."""
        features = self.feature_columns or ("numeric features",)
        shown = ", ".join(features) if len(features) <= 3 else f"{features[0]}..{features[-1]}"
        key = f"{self.key_column}, " if self.key_column else ""
        return escaped(f"{key}{self.label_column}, {shown} (any order)")

    def describe_labels(self) -> str:
        """What a label may be, for error messages."""
        if self.classes:
            shown = escaped(", ".join(self.classes[:5])) + (", ..." if len(self.classes) > 5 else "")
            return f"one of the classes {shown} (or an index in [0, {self.n_classes}))"
        if self.n_classes is None:
            return "an integer class of 0 or more"
        return f"an integer class in [0, {self.n_classes})"

    def prepared_arrow_schema(self) -> pa.Schema:
        """Column types of a prepared split file: features as float64 so raw values survive exactly."""
        return pa.schema(
            [
                pa.field(self.key_field, pa.string()),
                pa.field(self.label_column, pa.int64()),
                *(pa.field(name, pa.float64()) for name in self.feature_columns or ()),
                pa.field(SOURCE_FILE_COLUMN, pa.string()),
                pa.field(SOURCE_ROW_COLUMN, pa.int64()),
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "key_column": self.key_column,
            "label_column": self.label_column,
            "feature_columns": list(self.feature_columns) if self.feature_columns is not None else None,
            "n_classes": self.n_classes,
        }
        if self.classes is not None:  # absent, not null, so that schemas without names keep their versions
            document["classes"] = list(self.classes)
        return document

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TableSchema:
        features = data["feature_columns"]
        classes = data.get("classes")
        return cls(
            data["key_column"],
            data["label_column"],
            tuple(features) if features is not None else None,
            data["n_classes"],
            tuple(classes) if classes is not None else None,
        )


DIGITS_SCHEMA = TableSchema(
    key_column="row_key",
    label_column="label",
    feature_columns=tuple(f"pixel_{index}" for index in range(64)),
    n_classes=10,
)


def feature_matrix(table: pa.Table, schema: TableSchema) -> np.ndarray:
    """The feature columns as one float64 [rows, features] array, in the schema's column order."""
    if table.num_rows == 0:
        return np.zeros((0, len(schema.feature_columns)), dtype=np.float64)
    columns = [
        table.column(name).to_numpy().astype(np.float64, copy=False) for name in schema.feature_columns
    ]
    return np.column_stack(columns)
