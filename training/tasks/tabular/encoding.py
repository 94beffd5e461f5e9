"""What the model reads: a validated table's features as one float32 [rows, features] array of codes.

A numeric feature is its value, a boolean one 1 or 0, a categorical one its category's code: the
category's place in its column's vocabulary. A missing value is NaN whatever the type, and a category
the vocabulary does not hold (first seen at serving, or past `max_categories`) is `UNSEEN`. The model
(model.py) turns NaN into a missing indicator and `UNSEEN` into a shared embedding row, so serving needs
nothing but the vocabularies, which travel with the model.

Vocabularies only grow: a data version's vocabulary is its previous version's with the new categories
appended, in the order the folding meets them (within a chunk, sorted). So a part's codes keep their
meaning in every later version, and a full preparation, folding the same parts in the same order, builds
the same vocabularies as an incremental one. The classes of a label given as names grow the same way.

Which strings are missing follows `pandas.read_csv`'s defaults, so a value training reads as missing is
one a served DataFrame read from the same file holds as missing too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from training.tasks.tabular.schema import CATEGORICAL, TableSchema, numeric_matrix

UNSEEN = -1.0
# pandas.read_csv's default `na_values` (pandas._libs.parsers.STR_NA_VALUES), spelled out: the prepare
# step does not import pandas, and a pandas upgrade must not quietly change what a data version means.
MISSING_TEXT = frozenset(
    {
        "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
        "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null",
    }
)  # fmt: skip
TRUE_TEXT, FALSE_TEXT = frozenset({"true", "1"}), frozenset({"false", "0"})


class Vocabulary:
    """One column's categories (or a label's class names), in order of arrival, at most `limit` of them."""

    def __init__(self, values: Sequence[str] = (), limit: int | None = None) -> None:
        self.values = list(values)
        self.limit = limit
        self._index = {value: code for code, value in enumerate(self.values)}

    def grow(self, found: Iterable[str]) -> None:
        """Append the values of `found` not held yet, sorted, while there is room."""
        for value in sorted(set(found) - self._index.keys()):
            if self.limit is not None and len(self.values) >= self.limit:
                return
            self._index[value] = len(self.values)
            self.values.append(value)

    def codes(self, column: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """Each value's code as float64: NaN where missing (null), `UNSEEN` where not held."""
        text = column.cast(pa.string())
        found = pc.index_in(text, value_set=pa.array(self.values, pa.string()))
        codes = found.cast(pa.float64()).to_numpy(zero_copy_only=False)
        missing = text.is_null().to_numpy(zero_copy_only=False)
        return np.where(missing, np.nan, np.where(np.isnan(codes), UNSEEN, codes))


def distinct_text(column: pa.ChunkedArray) -> list[str]:
    """The distinct present values of a text column."""
    return [value for value in pc.unique(column.drop_null()).to_pylist() if value is not None]


def encode(table: pa.Table, schema: TableSchema, vocabularies: Mapping[str, Vocabulary]) -> np.ndarray:
    """The feature columns of a validated table as the model reads them: float64 [rows, features]."""
    columns = schema.feature_columns or ()
    out = np.empty((table.num_rows, len(columns)), dtype=np.float64)
    for position, name in enumerate(columns):
        if schema.feature_type(name) == CATEGORICAL:
            out[:, position] = vocabularies[name].codes(table.column(name))
        else:
            out[:, position] = numeric_matrix(table, (name,))[:, 0]
    return out
