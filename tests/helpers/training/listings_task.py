"""A user's task whose inputs are not only numbers: house listings with a price, a city (a category), a
kind (another) and a description (a text). Its model and training are the regression task's; what it
adds is `drift_features`, declared with the helpers of training/tasks/features.py, a line per input.

A prepared data version here is a folder with `train.csv` and a `manifest.json` naming its data version:
all a drift check reads of the reference. `write_listings` writes generated listings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from helpers.training.regression_task import RegressionTask
from training.tasks.base import FeatureTable
from training.tasks.features import category_shares, combine, numeric_features, text_features

CITIES, KINDS = ("aalborg", "bergen", "cork"), ("flat", "house")
WORDS = ("bright", "quiet", "garden", "balcony", "central", "renovated", "spacious", "cosy")


def write_listings(
    folder: Path,
    rows: int,
    seed: int,
    cities: Sequence[str] = CITIES,
    city_shares: Sequence[float] = (0.5, 0.3, 0.2),
) -> Path:
    """`rows` listings, cities drawn with `city_shares`, kinds half and half, descriptions of 3-8 words."""
    generator = np.random.default_rng(seed)
    descriptions = [
        " ".join(generator.choice(WORDS, size=int(generator.integers(3, 9)))) for _ in range(rows)
    ]
    frame = pd.DataFrame(
        {
            "price": generator.normal(300.0, 50.0, size=rows),
            "city": generator.choice(list(cities), size=rows, p=list(city_shares)),
            "kind": generator.choice(list(KINDS), size=rows),
            "description": descriptions,
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"listings-{seed}.csv"
    frame.to_csv(path, index=False)
    return path


def write_prepared(folder: Path, rows: int, seed: int) -> Path:
    """A prepared data version as this task has one: the train split and its manifest."""
    write_listings(folder, rows, seed).rename(folder / "train.csv")
    (folder / "manifest.json").write_text(json.dumps({"data_version": f"dv-{seed:016x}"}))
    return folder


class ListingsTask(RegressionTask):
    name = "listings"

    def drift_features(self, source: Path, *, prepared: bool) -> FeatureTable:
        files = [source / "train.csv"] if prepared else sorted(Path(source).glob("*.csv"))
        table = pd.concat([pd.read_csv(path, keep_default_na=False) for path in files], ignore_index=True)
        return combine(
            numeric_features({"price": table["price"]}),
            category_shares(table["city"], name="city"),
            category_shares(table["kind"], name="kind"),
            text_features(table["description"], name="description", top_k=5),
        )
