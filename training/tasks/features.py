"""Drift features in a line each, for a task's `drift_features`: numbers, categories and texts.

    from training.tasks.features import category_shares, combine, numeric_features, text_features

    def drift_features(self, source, *, prepared):
        table = read(source)  # your rows: a pandas DataFrame, say
        return combine(
            numeric_features({"price": table["price"], "rooms": table["rooms"]}),
            category_shares(table["city"], name="city"),
            text_features(table["description"], name="description"),
        )

- `numeric_features`: columns of finite numbers, as they are.
- `category_shares`: one column per category, one-hot per row, so the drift check compares each
  category's share of rows; `city:other` counts categories the reference never had. The categories come
  from the reference (the champion's training data) unless `categories=` fixes them.
- `text_features`: each text's length in characters (`NAME:chars`) and tokens (`NAME:tokens`), the shares
  of its tokens that are each of the reference's `top_k` most frequent tokens (`NAME=TOKEN`) or none of
  them (`NAME:other`), and its out-of-vocabulary rate (`NAME:oov`, tokens the reference never had).

Which columns shares get is decided when the drift check pairs the current data with the reference
(training/data/token_shares.py), never by either side alone, so both sides always have the same columns.
Bad values are refused in one line naming the input and its row: a missing or non-finite number, text
that is not UTF-8.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from core.errors import InputError
from training.data.token_shares import TokenGroup
from training.tasks.base import FeatureTable

DEFAULT_TOP_K = 10
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The default tokenizer: runs of letters, digits and '_', lowercased (Unicode-aware)."""
    return _WORD.findall(text.lower())


def numeric_features(columns: Mapping[str, Iterable[Any]]) -> FeatureTable:
    """One feature per named column of finite numbers."""
    names = tuple(columns)
    if not names:
        raise InputError("numeric_features: no columns; expected a mapping of name to numbers")
    arrays = [_numbers(values, name) for name, values in columns.items()]
    lengths = {len(array) for array in arrays}
    if len(lengths) != 1:
        raise InputError(
            f"numeric_features {list(names)}: columns of {sorted(lengths)} rows; expected one length"
        )
    return FeatureTable(names, np.column_stack(arrays))


def category_shares(
    values: Iterable[Any], *, name: str, categories: Sequence[Any] | None = None
) -> FeatureTable:
    """A categorical input as one-hot category shares: `NAME=CATEGORY` per category and `NAME:other`.

    A category is text (bytes are read as UTF-8) or a finite number (a whole number is written without a
    decimal point, so 3 and 3.0 are one category whichever way a file was parsed)."""
    rows = tuple((_category(value, name, row),) for row, value in enumerate(values))
    fixed = (
        None
        if categories is None
        else tuple(_category(value, f"{name} categories", row) for row, value in enumerate(categories))
    )
    return _group_table(TokenGroup(name, rows, vocabulary=fixed), len(rows))


def text_features(
    texts: Iterable[Any],
    *,
    name: str,
    top_k: int = DEFAULT_TOP_K,
    tokenize: Callable[[str], Sequence[str]] = words,
) -> FeatureTable:
    """A text input as its lengths (`NAME:chars`, `NAME:tokens`) and its tokens' shares of the reference's
    vocabulary (`NAME=TOKEN` for its `top_k` most frequent, `NAME:other`, `NAME:oov`)."""
    decoded = [_text(text, name, row) for row, text in enumerate(texts)]
    tokens = tuple(tuple(str(token) for token in tokenize(text)) for text in decoded)
    lengths = np.array(
        [[len(text), len(row)] for text, row in zip(decoded, tokens, strict=True)], dtype=np.float64
    )
    group = TokenGroup(name, tokens, top_k=top_k, out_of_vocabulary=True)
    return FeatureTable((f"{name}:chars", f"{name}:tokens"), lengths.reshape(len(decoded), 2), (group,))


def combine(*tables: FeatureTable) -> FeatureTable:
    """Feature tables of the same rows side by side."""
    if not tables:
        raise InputError("combine: no feature tables; expected at least one")
    rows = {len(table) for table in tables}
    if len(rows) != 1:
        raise InputError(f"combine: tables of {sorted(rows)} rows; expected the same items in each")
    return FeatureTable(
        tuple(name for table in tables for name in table.names),
        np.hstack([table.values for table in tables]),
        tuple(group for table in tables for group in table.groups),
    )


# -- values ---------------------------------------------------------------------------------------------


def _group_table(group: TokenGroup, rows: int) -> FeatureTable:
    return FeatureTable((), np.zeros((rows, 0)), (group,))


def _numbers(values: Iterable[Any], name: str) -> np.ndarray:
    numbers = []
    for row, value in enumerate(values):
        number = _finite(value, name, row)
        if number is None:
            raise InputError(f"{name} row {row}: {_shown(value)}; expected a finite number")
        numbers.append(number)
    return np.array(numbers, dtype=np.float64)


def _finite(value: Any, name: str, row: int) -> float | None:
    """`value` as a float when it is a number (numpy's included), None when it is not one at all."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    number = float(value)
    if not math.isfinite(number):
        raise InputError(
            f"{name} row {row}: {number}; expected a finite number (fill or drop missing values)"
        )
    return number


def _category(value: Any, name: str, row: int) -> str:
    if value is None or (isinstance(value, float | np.floating) and not math.isfinite(float(value))):
        raise InputError(
            f"{name} row {row}: {'missing' if value is None else float(value)}; expected a category: text "
            "or a finite number (fill missing values, e.g. with 'unknown')"
        )
    if isinstance(value, bytes | str):
        return _text(value, name, row)
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    number = _finite(value, name, row)
    if number is None:
        raise InputError(f"{name} row {row}: {_shown(value)}; expected a category: text or a finite number")
    return str(int(number)) if number.is_integer() else repr(number)


def _text(value: Any, name: str, row: int) -> str:
    """`value` as text: str as it is, bytes decoded as UTF-8; refused when it is not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(
                f"{name} row {row}: not UTF-8 text (byte {error.object[error.start]:#04x} at {error.start}); "
                "expected text encoded as UTF-8"
            ) from None
    if isinstance(value, str):
        try:
            value.encode("utf-8")  # a lone surrogate: bytes decoded with errors="surrogateescape"
        except UnicodeEncodeError as error:
            raise InputError(
                f"{name} row {row}: not UTF-8 text (undecodable character at {error.start}); expected text "
                "encoded as UTF-8"
            ) from None
        return value
    if value is None or (isinstance(value, float | np.floating) and not math.isfinite(float(value))):
        raise InputError(f"{name} row {row}: missing; expected text (fill missing values, e.g. with '')")
    raise InputError(f"{name} row {row}: {_shown(value)}; expected text (str, or UTF-8 bytes)")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
