"""A user's house-price regression, written from the task contract in training/tasks/base.py alone, as a
user who never read the built-in tasks writes it: numeric columns (`bedrooms` and `sqft` whole numbers,
`lot_acres` decimals), one text column (`description`) and the target `price`.

It trains on floats: `prepare` reads every numeric column as float64, and `input_example` returns them as
it holds them, float64, whole-number columns included. Its drift features name each numeric column and
the description's text features, with the helpers of training/tasks/features.py. A prepared data version is
`data.csv` (every row, with its split) and `manifest.json`.

`write_houses(folder, rows, seed)` writes generated listings as one raw CSV file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from training.data.publish import publish
from training.data.splits import SPLIT_NAMES, assign_splits
from training.tasks.base import FeatureTable, Metric, MetricSet, TaskData, TensorSplit
from training.tasks.features import combine, numeric_features, text_features

NUMBERS = ("bedrooms", "sqft", "lot_acres")
TEXT = "description"
TARGET = "price"
WORDS = ("garden", "bright", "quiet", "central", "renovated", "spacious")


def write_houses(folder: Path, rows: int, seed: int) -> Path:
    """`rows` listings: price (in thousands) from rooms, floor area, lot and whether a garden is mentioned."""
    generator = np.random.default_rng(seed)
    bedrooms = generator.integers(1, 6, size=rows)
    sqft = generator.integers(500, 3500, size=rows)
    lot_acres = np.round(generator.uniform(0.05, 2.0, size=rows), 2)
    lengths = generator.integers(2, 6, size=rows)
    descriptions = [" ".join(generator.choice(WORDS, size=int(length))) for length in lengths]
    garden = np.array(["garden" in text.split() for text in descriptions], dtype=np.float64)
    price = 0.4 * bedrooms + 0.001 * sqft + 0.3 * lot_acres + 0.25 * garden + generator.normal(0, 0.05, rows)
    frame = pd.DataFrame(
        {"bedrooms": bedrooms, "sqft": sqft, "lot_acres": lot_acres, TEXT: descriptions, TARGET: price}
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"houses-{seed}.csv"
    frame.to_csv(path, index=False)
    return path


class HouseSplit(TensorSplit):
    """A split's model inputs and prices as tensors, and its rows as the raw files have them."""

    def __init__(self, rows: pd.DataFrame, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        super().__init__(inputs, targets)
        self.rows = rows


def model_inputs(table: pd.DataFrame) -> torch.Tensor:
    """What the model reads: the numbers (floor area in thousands) and whether a garden is mentioned."""
    numbers = table[list(NUMBERS)].to_numpy(dtype=np.float64) * np.array([1.0, 0.001, 1.0])
    garden = np.array([["garden" in str(text).split()] for text in table[TEXT]], dtype=np.float64)
    return torch.tensor(np.hstack([numbers, garden]), dtype=torch.float32)


class HousePrices:
    name = "house-prices"
    raw_suffixes = (".csv",)
    metrics = MetricSet((Metric("mse", "lower"), Metric("mae", "lower")))
    default_primary_metric = "mse"

    def options(self) -> Mapping[str, Any]:
        return {}

    def _read(self, folder: Path) -> pd.DataFrame:
        files = sorted(Path(folder).glob("*.csv"))
        tables = [pd.read_csv(path, keep_default_na=False)[[*NUMBERS, TEXT, TARGET]] for path in files]
        return pd.concat(tables, ignore_index=True).astype(dict.fromkeys([*NUMBERS, TARGET], "float64"))

    def prepare(self, raw: Path, out: Path, *, previous: Path | None, split: Any) -> str:
        table = self._read(raw).drop_duplicates().sort_values([*NUMBERS, TEXT, TARGET])
        keys = [f"{row}" for row in table.itertuples(index=False)]  # a row's split follows its content
        table["split"] = [SPLIT_NAMES[index] for index in assign_splits(keys, split)]
        data = table.to_csv(index=False).encode()
        version = "dv-" + hashlib.sha256(data).hexdigest()[:16]
        manifest = json.dumps({"data_version": version}).encode()
        publish(Path(out), {"data.csv": data, "manifest.json": manifest})  # all files or none, manifest last
        return version

    def load(self, data_dir: Path) -> TaskData:
        table = pd.read_csv(Path(data_dir) / "data.csv", keep_default_na=False)
        splits = {}
        for name in SPLIT_NAMES:
            rows = table[table["split"] == name].reset_index(drop=True)
            target = torch.tensor(rows[TARGET].to_numpy(), dtype=torch.float32)
            splits[name] = HouseSplit(rows, model_inputs(rows), target)
        version = json.loads((Path(data_dir) / "manifest.json").read_text())["data_version"]
        return TaskData(version, splits, {"inputs": 4})

    def build_model(self, info: Mapping[str, Any]) -> nn.Module:
        return nn.Linear(int(info["inputs"]), 1)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x).squeeze(-1), y)

    def score(self, model: nn.Module, split: Any) -> dict[str, float]:
        x, y = split[torch.arange(len(split))]
        error = model(x).squeeze(-1) - y
        return {"mse": error.pow(2).mean().item(), "mae": error.abs().mean().item()}

    def input_example(self, data: TaskData) -> Any:
        return data.split("test").rows[[*NUMBERS, TEXT]].head(3)  # the numbers as float64, as trained on

    def predict(self, model: nn.Module, info: Mapping[str, Any], inputs: Any) -> Any:
        return model(model_inputs(inputs)).squeeze(-1).numpy()

    def drift_features(self, source: Path, *, prepared: bool) -> FeatureTable:
        if prepared:  # the reference: the training split of the champion's data
            table = pd.read_csv(Path(source) / "data.csv", keep_default_na=False).query("split == 'train'")
        else:
            table = self._read(source)
        return combine(
            numeric_features({name: table[name] for name in NUMBERS}),
            text_features(table[TEXT], name=TEXT),
        )
