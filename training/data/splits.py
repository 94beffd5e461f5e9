"""Stable train/validation/test splits: each item goes to a split by a salted hash of its key alone, so an
item never changes split as the data grows, whichever task it belongs to."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import InputError

SPLIT_NAMES = ("train", "validation", "test")
# The salt is part of the format, not a setting: changing it would move rows between splits.
SPLIT_SALT = "retrain-split-v1"
SPLIT_METHOD = "sha256(salt + key) as a uniform number in [0, 1)"


@dataclass(frozen=True)
class SplitFractions:
    """Shares of rows for train/validation/test; each split must get some rows, and they add up to 1."""

    train: float = 0.8
    validation: float = 0.1
    test: float = 0.1

    def __post_init__(self) -> None:
        for name, value in self.as_dict().items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
                raise InputError(
                    f"split fraction {name}={value!r} is out of range; expected a number between 0 and 1 "
                    "(exclusive), e.g. --split 0.8,0.1,0.1"
                )
        total = self.train + self.validation + self.test
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            raise InputError(
                f"split fractions train={self.train}, validation={self.validation}, test={self.test} add up "
                f"to {total:g}; change them so they add up to 1, e.g. --split 0.8,0.1,0.1"
            )

    @classmethod
    def parse(cls, text: str) -> SplitFractions:
        """Parse 'TRAIN,VALIDATION,TEST', e.g. '0.8,0.1,0.1'."""
        parts = text.split(",")
        try:
            values = [float(part) for part in parts]
        except ValueError:
            values = []
        if len(values) != len(SPLIT_NAMES):
            raise InputError(
                f"split {text!r} is not three numbers; expected TRAIN,VALIDATION,TEST e.g. 0.8,0.1,0.1"
            )
        return cls(*values)

    def as_dict(self) -> dict[str, float]:
        return {"train": self.train, "validation": self.validation, "test": self.test}


def split_position(key: str) -> float:
    """A stable, uniform number in [0, 1) for a key: the top 53 bits of sha256(salt + key)."""
    digest = hashlib.sha256(f"{SPLIT_SALT}\x00{key}".encode()).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / float(1 << 53)


def assign_splits(keys: Sequence[str], fractions: SplitFractions) -> np.ndarray:
    """Index into SPLIT_NAMES for each key."""
    positions = np.fromiter((split_position(key) for key in keys), dtype=np.float64, count=len(keys))
    bounds = np.array([fractions.train, fractions.train + fractions.validation])
    return np.searchsorted(bounds, positions, side="right")


def split_config(fractions: SplitFractions) -> dict[str, Any]:
    return {"method": SPLIT_METHOD, "salt": SPLIT_SALT, "fractions": fractions.as_dict()}
