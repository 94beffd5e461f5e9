"""Non-numeric data as numbers a drift check can compare: each row's tokens, as shares of a vocabulary.

A categorical column is one token a row (its category); a text is its words. Which shares are compared is
decided by the reference, never by the data being checked: a drift check computes the vocabulary from the
reference's rows (or takes the one a task fixed) and turns both sides into the same columns,

- `NAME=TOKEN`, for each of the vocabulary's tokens that gets a column (its `top_k` most frequent, or all
  of them): the share of a row's tokens that are TOKEN. For a category, one-hot: 1 in its category's
  column, so comparing the column's distribution compares the category's share of rows;
- `NAME:other`: the share of a row's tokens that have no column, which holds what the reference never
  had (a category first seen in the current data);
- `NAME:oov`, when asked for: the share of a row's tokens outside the reference's whole vocabulary, the
  out-of-vocabulary rate.

A row without tokens (an empty text) is 0 in every column. Tokens are compared as they are: whoever makes
them (training/tasks/features.py) decides case and normal form.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.errors import InputError

OTHER, OUT_OF_VOCABULARY = "other", "oov"


@dataclass(frozen=True)
class TokenGroup:
    """One non-numeric input of a feature table: `rows` holds each row's tokens. `vocabulary` fixes the
    share columns (a task that knows its categories); None takes them from the reference's rows: its
    `top_k` most frequent tokens (None: every token). `out_of_vocabulary` adds the `NAME:oov` column."""

    name: str
    rows: tuple[tuple[str, ...], ...]
    vocabulary: tuple[str, ...] | None = None
    top_k: int | None = None
    out_of_vocabulary: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InputError(f"drift features: token group name {self.name!r}; expected a non-empty name")
        object.__setattr__(self, "rows", tuple(tuple(row) for row in self.rows))
        if self.vocabulary is not None:
            vocabulary = tuple(self.vocabulary)
            if len(set(vocabulary)) != len(vocabulary) or not vocabulary:
                raise InputError(
                    f"drift features {self.name}: vocabulary {list(vocabulary)[:10]}; expected distinct "
                    "tokens"
                )
            object.__setattr__(self, "vocabulary", vocabulary)
        top_k = self.top_k
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise InputError(
                f"drift features {self.name}: top_k {top_k!r}; expected a whole number >= 1 or None"
            )

    def counts(self) -> Counter[str]:
        return Counter(token for row in self.rows for token in row)


@dataclass(frozen=True)
class Vocabulary:
    """What the reference decides for a group: the tokens with a column, and every token it had."""

    columns: tuple[str, ...]
    known: frozenset[str]


def vocabulary_of(reference: TokenGroup) -> Vocabulary:
    """The reference group's share columns: its fixed vocabulary, else its tokens by frequency (ties by
    token, so the columns do not depend on row order), the `top_k` first."""
    counts = reference.counts()
    if reference.vocabulary is not None:
        return Vocabulary(reference.vocabulary, frozenset(counts) | frozenset(reference.vocabulary))
    ranked = sorted(counts, key=lambda token: (-counts[token], token))
    columns = tuple(ranked if reference.top_k is None else ranked[: reference.top_k])
    return Vocabulary(columns, frozenset(counts))


def column_names(group: TokenGroup, vocabulary: Vocabulary) -> tuple[str, ...]:
    names = [f"{group.name}={token}" for token in vocabulary.columns] + [f"{group.name}:{OTHER}"]
    if group.out_of_vocabulary:
        names.append(f"{group.name}:{OUT_OF_VOCABULARY}")
    return tuple(names)


def share_values(group: TokenGroup, vocabulary: Vocabulary) -> np.ndarray:
    """[rows, columns] shares of each row's tokens, in `column_names`' order."""
    index = {token: position for position, token in enumerate(vocabulary.columns)}
    width = len(index) + 1 + (1 if group.out_of_vocabulary else 0)
    values = np.zeros((len(group.rows), width), dtype=np.float64)
    for row, tokens in enumerate(group.rows):
        if not tokens:
            continue
        share = 1.0 / len(tokens)
        for token in tokens:
            values[row, index.get(token, len(index))] += share
            if group.out_of_vocabulary and token not in vocabulary.known:
                values[row, -1] += share
    return values


def check_same_groups(reference: Sequence[TokenGroup], current: Sequence[TokenGroup]) -> None:
    """Both sides must hold the same token groups, by name, with the same settings."""
    mine = {group.name: (group.vocabulary, group.top_k, group.out_of_vocabulary) for group in reference}
    theirs = {group.name: (group.vocabulary, group.top_k, group.out_of_vocabulary) for group in current}
    if mine != theirs:
        raise InputError(
            f"--current: its token groups {sorted(theirs)} differ from the reference's {sorted(mine)} (or "
            "their settings do); expected data of the same task and options"
        )
