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

# What a feature column holds. A numeric one is a number; a categorical one a category (text, or a number
# taken as a name: a postcode); a boolean one true or false. Any of them may be missing in any row.
NUMERIC, CATEGORICAL, BOOLEAN = "numeric", "categorical", "boolean"
FEATURE_TYPES = (NUMERIC, CATEGORICAL, BOOLEAN)
CLASSIFICATION, REGRESSION = "classification", "regression"
OBJECTIVES = (CLASSIFICATION, REGRESSION)
# How a validated table holds the label: a class index (int64; class names declared in `classes` are
# mapped to theirs when read), a class name (text; the classes are the names found, in order of first
# arrival), or a regression target (float64).
LABEL_INDEX, LABEL_NAME, LABEL_NUMBER = "index", "name", "number"
# A column's categories beyond this many (in order of arrival) share one code, "unseen": an identifier
# column mistaken for a category would otherwise grow the manifest and the model without bound.
DEFAULT_MAX_CATEGORIES = 1000


@dataclass(frozen=True)
class TableSchema:
    """The columns of a raw batch: an optional key, one label, and features of three types.

    The tabular task's options build one. Parts may be left open and are fixed when a data version is
    prepared (and recorded in its manifest): `feature_columns=None` means every column of the raw files but
    the key and the label, in file order; `feature_types=None` means each feature's type as declared in
    `column_types`, else as the raw data shows it (raw_files.py `with_features`); `label_kind=None` means
    class indices when the labels are whole numbers, class names otherwise; `n_classes=None` means the
    classes found. With `key_column=None` a row's key is derived from its content (`DERIVED_KEY_COLUMN`),
    so exact duplicates still collapse and a row's split is stable. With `classes` (class names), the label
    column holds those names (or their indices) and each becomes its index. A regression schema
    (`objective="regression"`) has a numeric label and no classes.
    """

    key_column: str | None
    label_column: str
    feature_columns: tuple[str, ...] | None
    n_classes: int | None
    classes: tuple[str, ...] | None = None
    objective: str = CLASSIFICATION
    column_types: tuple[tuple[str, str], ...] = ()
    feature_types: tuple[str, ...] | None = None
    label_kind: str | None = None
    max_categories: int = DEFAULT_MAX_CATEGORIES

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_column", self.key_column or None)
        limit = self.max_categories
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InputError(f"max_categories {limit!r}: expected a whole number of at least 1")
        if self.feature_columns is not None:
            if isinstance(self.feature_columns, str):
                raise InputError(f"feature_columns {self.feature_columns!r}: expected a list of column names")
            object.__setattr__(self, "feature_columns", tuple(self.feature_columns))
            if not self.feature_columns:
                raise InputError(
                    "a table schema needs at least one feature column; list them in feature_columns"
                )
        self._check_objective()
        self._check_types()
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

    def _check_objective(self) -> None:
        if self.objective not in OBJECTIVES:
            raise InputError(f"objective {self.objective!r}: expected one of {', '.join(OBJECTIVES)}")
        if self.objective == REGRESSION:
            if self.classes is not None or self.n_classes is not None:
                raise InputError(
                    "objective 'regression' predicts a number: leave out classes and n_classes, or set "
                    "objective = 'classification'"
                )
            object.__setattr__(self, "label_kind", self.label_kind or LABEL_NUMBER)
        elif self.classes is not None:
            object.__setattr__(self, "label_kind", self.label_kind or LABEL_INDEX)
        expected = (LABEL_NUMBER,) if self.objective == REGRESSION else (LABEL_INDEX, LABEL_NAME)
        if self.label_kind is not None and self.label_kind not in expected:
            raise InputError(f"label kind {self.label_kind!r}: expected one of {', '.join(expected)}")

    def _check_types(self) -> None:
        declared = self.column_types
        if isinstance(declared, dict):
            declared = tuple(declared.items())
        if not isinstance(declared, tuple | list) or not all(
            isinstance(pair, tuple | list) and len(pair) == 2 for pair in declared
        ):
            raise InputError(
                f"column_types {self.column_types!r}: expected a table of column name = type, e.g. "
                '{ city = "categorical" }'
            )
        declared = tuple(sorted((str(name), str(kind)) for name, kind in declared))
        for name, kind in declared:
            if kind not in FEATURE_TYPES:
                raise InputError(
                    f"column_types {name} = {kind!r}: expected one of {', '.join(FEATURE_TYPES)}"
                )
            if name in (self.key_column, self.label_column):
                raise InputError(
                    f"column_types names {name!r}, the key or the label column; name feature columns only"
                )
            if self.feature_columns is not None and name not in self.feature_columns:
                raise InputError(
                    f"column_types names {name!r}, which is not among feature_columns; add it there or "
                    "drop it from column_types"
                )
        object.__setattr__(self, "column_types", declared)
        if self.feature_types is not None:
            object.__setattr__(self, "feature_types", tuple(self.feature_types))
            if self.feature_columns is None or len(self.feature_types) != len(self.feature_columns):
                raise InputError("feature_types must give one type per feature column")
            if any(kind not in FEATURE_TYPES for kind in self.feature_types):
                raise InputError(f"feature_types {list(self.feature_types)}: expected {FEATURE_TYPES}")

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
    def is_regression(self) -> bool:
        return self.objective == REGRESSION

    @property
    def is_resolved(self) -> bool:
        classes_known = self.is_regression or self.n_classes is not None
        return (
            self.feature_columns is not None
            and self.feature_types is not None
            and self.label_kind is not None
            and classes_known
        )

    def feature_type(self, name: str) -> str:
        """The type of feature column `name`: as resolved, else as declared; numeric when neither says."""
        if self.feature_types is not None and self.feature_columns is not None:
            return self.feature_types[self.feature_columns.index(name)]
        return dict(self.column_types).get(name, NUMERIC)

    def columns_of(self, kind: str) -> tuple[str, ...]:
        """The feature columns of one type, in schema order."""
        return tuple(name for name in self.feature_columns or () if self.feature_type(name) == kind)

    def with_features_from(self, header: list[str]) -> TableSchema:
        """This schema with open feature columns taken from a raw file's header: every column but the
        key and the label, in file order."""
        if self.feature_columns is not None:
            return self
        features = tuple(name for name in header if name not in (self.key_column, self.label_column))
        if not features:
            raise InputError(
                f"the raw files have no columns besides {escaped(', '.join(self.named_columns))}; expected "
                "feature columns"
            )
        undeclared = [name for name, _ in self.column_types if name not in features]
        if undeclared:
            raise InputError(
                f"column_types names {escaped(', '.join(undeclared))}, which the raw files do not have; "
                f"their columns are {escaped(', '.join(header))}"
            )
        return dataclasses.replace(self, feature_columns=features)

    def accepts(self, prepared: TableSchema) -> bool:
        """Whether a data version prepared with `prepared` is what this (possibly open) schema describes."""
        declared_match = all(
            prepared.feature_columns is not None
            and name in prepared.feature_columns
            and prepared.feature_type(name) == kind
            for name, kind in self.column_types
        )
        return (
            self.key_column == prepared.key_column
            and self.label_column == prepared.label_column
            and self.objective == prepared.objective
            and self.classes in (None, prepared.classes)
            and self.feature_columns in (None, prepared.feature_columns)
            and self.n_classes in (None, prepared.n_classes)
            and self.label_kind in (None, prepared.label_kind)
            and self.max_categories == prepared.max_categories
            and declared_match
        )

    def describe_columns(self) -> str:
        """A short human form of the expected columns, for error messages (escaped: names come from data)."""
        features = self.feature_columns or ("feature columns",)
        shown = ", ".join(features) if len(features) <= 3 else f"{features[0]}..{features[-1]}"
        key = f"{self.key_column}, " if self.key_column else ""
        return escaped(f"{key}{self.label_column}, {shown} (any order)")

    def describe_labels(self) -> str:
        """What a label may be, for error messages."""
        if self.is_regression:
            return "a finite number (the regression target)"
        if self.classes and self.label_kind == LABEL_INDEX:
            shown = escaped(", ".join(self.classes[:5])) + (", ..." if len(self.classes) > 5 else "")
            return f"one of the classes {shown} (or an index in [0, {self.n_classes}))"
        if self.label_kind == LABEL_NAME:
            return "a class name (non-empty text)"
        if self.n_classes is None:
            return "an integer class of 0 or more"
        return f"an integer class in [0, {self.n_classes})"

    def label_arrow_type(self) -> pa.DataType:
        return {LABEL_NUMBER: pa.float64(), LABEL_NAME: pa.string()}.get(self.label_kind or "", pa.int64())

    def prepared_arrow_schema(self) -> pa.Schema:
        """Column types of a validated table and a prepared split file, values exact: numbers as float64,
        categories as text, booleans as bool; a missing value is null."""
        kinds = {NUMERIC: pa.float64(), CATEGORICAL: pa.string(), BOOLEAN: pa.bool_()}
        return pa.schema(
            [
                pa.field(self.key_field, pa.string()),
                pa.field(self.label_column, self.label_arrow_type()),
                *(pa.field(name, kinds[self.feature_type(name)]) for name in self.feature_columns or ()),
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
            "objective": self.objective,
            "column_types": dict(self.column_types),
            "feature_types": list(self.feature_types) if self.feature_types is not None else None,
            "label_kind": self.label_kind,
            "max_categories": self.max_categories,
        }
        if self.classes is not None:  # absent, not null, so that schemas without names keep their versions
            document["classes"] = list(self.classes)
        return document

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TableSchema:
        features, classes, types = data["feature_columns"], data.get("classes"), data.get("feature_types")
        return cls(
            data["key_column"],
            data["label_column"],
            tuple(features) if features is not None else None,
            data["n_classes"],
            tuple(classes) if classes is not None else None,
            objective=data.get("objective", CLASSIFICATION),
            column_types=tuple(dict(data.get("column_types") or {}).items()),
            feature_types=tuple(types) if types is not None else None,
            label_kind=data.get("label_kind"),
            max_categories=int(data.get("max_categories", DEFAULT_MAX_CATEGORIES)),
        )


DIGITS_SCHEMA = TableSchema(
    key_column="row_key",
    label_column="label",
    feature_columns=tuple(f"pixel_{index}" for index in range(64)),
    n_classes=10,
    feature_types=(NUMERIC,) * 64,
    label_kind=LABEL_INDEX,
)


def numeric_matrix(table: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """Numeric or boolean columns as one float64 [rows, columns] array, a missing value as NaN."""
    if table.num_rows == 0 or not columns:
        return np.zeros((table.num_rows, len(columns)), dtype=np.float64)
    arrays = []
    for name in columns:
        column = table.column(name)
        if pa.types.is_boolean(column.type):
            column = column.cast(pa.float64())
        arrays.append(column.to_numpy(zero_copy_only=False).astype(np.float64, copy=False))
    return np.column_stack(arrays)
