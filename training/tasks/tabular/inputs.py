"""What a caller of a served tabular model has, as the model reads it: a DataFrame (`pandas.read_csv` of a
raw file, or any JSON form MLflow parses into one) -> the encoded float32 [rows, features] array of
training/tasks/tabular/encoding.py, by the vocabularies the model carries in its `info`.

A column is matched by name (the key, the label and other extra columns are ignored), and a value is
read as the data version read it: a blank or pandas' missing value is missing in any feature; a number
is a number whether it came as int64, float64 or text; a category is its text (a number read by
read_csv as 3 is the category "3"); a boolean is true/false or 1/0. A category the vocabulary does not
hold is `UNSEEN`. A value of the wrong kind is refused in one line naming its row and column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from core.errors import InputError
from core.text import escaped
from training.tasks.tabular.encoding import FALSE_TEXT, MISSING_TEXT, TRUE_TEXT, UNSEEN
from training.tasks.tabular.schema import BOOLEAN, CATEGORICAL, NUMERIC

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def feature_array(inputs: Any, info: Mapping[str, Any]) -> np.ndarray:
    """The model's input for `inputs`: float32 [rows, features], NaN where a value is missing."""
    import pandas as pd  # comes with MLflow, which serving needs anyway

    columns: list[str] = list(info["feature_columns"])
    types: Sequence[str] = info.get("feature_types") or [NUMERIC] * len(columns)
    if _is_table(inputs):
        # MLflow hands a JSON body's `inputs` (columns) or `instances` (records) over as it parsed them when
        # the model has no input schema: a dict of columns, or a list of rows by name.
        inputs = pd.DataFrame(inputs)
    if isinstance(inputs, pd.DataFrame):
        missing = [name for name in columns if name not in inputs.columns]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise InputError(
                f"the input lacks feature column(s) {escaped(shown)}; expected a table with the columns "
                f"{escaped(', '.join(columns[:5]))}{', ...' if len(columns) > 5 else ''}"
            )
        vocabularies = info.get("vocabularies") or {}
        encoded = [
            _column(inputs[name].to_numpy(dtype=object), name, kind, vocabularies.get(name, ()))
            for name, kind in zip(columns, types, strict=True)
        ]
        return np.column_stack(encoded).astype(np.float32) if encoded else np.zeros((0, 0), np.float32)
    if CATEGORICAL in types:
        raise InputError(
            f"input of type {type(inputs).__name__}: this model has categorical features; expected a "
            "DataFrame with the columns " + escaped(", ".join(columns[:5]))
        )
    array = inputs.detach().cpu().numpy() if isinstance(inputs, torch.Tensor) else np.asarray(inputs)
    if array.ndim != 2 or array.shape[1] != len(columns):
        raise InputError(
            f"input of shape {array.shape}: expected a DataFrame with the feature columns, or a "
            f"[rows, {len(columns)}] array of features in the order {columns[0]}..{columns[-1]}"
        )
    try:
        array = array.astype(np.float64)
    except (TypeError, ValueError) as error:
        raise InputError(f"input array: expected numbers ({error})") from None
    if np.isinf(array).any() or (np.abs(np.nan_to_num(array)) > _FLOAT32_MAX).any():
        raise InputError("input array: expected finite numbers (NaN for a missing value), found infinity")
    return array.astype(np.float32)


def _is_table(inputs: Any) -> bool:
    """A dict of columns, or a non-empty list of dicts (rows by column name)."""
    if isinstance(inputs, Mapping):
        return True
    return isinstance(inputs, list) and bool(inputs) and all(isinstance(row, Mapping) for row in inputs)


def _column(values: np.ndarray, name: str, kind: str, vocabulary: Sequence[str]) -> np.ndarray:
    out = np.full(len(values), np.nan)
    index = {category: code for code, category in enumerate(vocabulary)} if kind == CATEGORICAL else {}
    for row, value in enumerate(values):
        if isinstance(value, np.ndarray) and value.ndim == 0:  # MLflow's parse of `instances` wraps each
            value = value.item()
        if _is_missing(value):
            continue
        if kind == CATEGORICAL:
            out[row] = index.get(_category(value), UNSEEN)
        elif kind == BOOLEAN:
            out[row] = _truth(value, row, name)
        else:
            out[row] = _number(value, row, name)
    return out


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float | np.floating):
        return bool(np.isnan(value))
    if isinstance(value, str):
        return value in MISSING_TEXT
    try:
        import pandas as pd

        return value is pd.NA or value is pd.NaT
    except ImportError:  # pragma: no cover
        return False


def _category(value: Any) -> str:
    """A category's text as the prepare step holds it: text as it is, a whole number without a decimal
    point (read_csv reads the category "3" as 3), a boolean as true/false (as pyarrow writes one)."""
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _truth(value: Any, row: int, name: str) -> float:
    if isinstance(value, bool | np.bool_):
        return float(bool(value))
    if isinstance(value, int | float | np.integer | np.floating) and float(value) in (0.0, 1.0):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in TRUE_TEXT or text in FALSE_TEXT:
            return float(text in TRUE_TEXT)
    raise InputError(
        f"input row {row + 1}, column {escaped(name)!r}: expected true or false (or 1 or 0), or a blank, "
        f"got {escaped(repr(value))[:60]}"
    )


def _number(value: Any, row: int, name: str) -> float:
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        number = np.nan
    if isinstance(value, bool | np.bool_) or not np.isfinite(number) or abs(number) > _FLOAT32_MAX:
        raise InputError(
            f"input row {row + 1}, column {escaped(name)!r}: expected a finite number, or a blank, got "
            f"{escaped(repr(value))[:60]}"
        )
    return number
