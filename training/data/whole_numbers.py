"""Which numeric columns hold only whole numbers: the columns a raw CSV of the data reads to int64
(`pandas.read_csv`), which a served model must then take as whole numbers (MLflow refuses int64 into a
double column). The built-in tabular task and the gate's serving both decide by this one rule."""

from __future__ import annotations

import numpy as np

# float64 holds every integer up to 2**53 exactly; past it a value's "wholeness" says nothing of the data.
EXACT_INTEGERS_UP_TO = 2.0**53


def whole_columns(values: np.ndarray) -> np.ndarray:
    """For a [rows, columns] array of numbers, whether each column holds only whole numbers (finite, of
    magnitude at most 2**53). Read from float64 values: float32 rounds a large decimal to a whole number.
    A column of no rows holds only whole numbers; a caller that must see some data checks the rows."""
    values = np.asarray(values, dtype=np.float64)
    whole = (values == np.round(values)) & (np.abs(values) <= EXACT_INTEGERS_UP_TO)
    return np.asarray(whole.all(axis=0), dtype=bool)
