"""A user's own task, written from the public contract in training/tasks/base.py alone: linear regression.

Raw data: CSV files with numeric columns x0..x{n-1} and a target y. The model is one linear layer; the
metrics are the mean squared error (the primary metric, lower is better), the mean absolute error (lower)
and R² (higher). Nothing here reaches into the engine, the gate or the built-in tasks.

`write_sample(folder, rows, seed)` writes generated data, for the tests that use this task.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from training.tasks.base import FeatureTable, Metric, MetricSet, TaskData, TensorSplit

SPLITS = ("train", "validation", "test")
WEIGHTS = (2.0, -1.0, 0.5, 3.0, -2.0, 1.5)


def write_sample(folder: Path, rows: int = 600, seed: int = 0, features: int = 3, shift: float = 0.0) -> Path:
    """`rows` rows of y = w·x + 1 + noise, in one CSV file named after the seed."""
    generator = np.random.default_rng(seed)
    x = generator.normal(shift, 1.0, size=(rows, features))
    y = x @ np.asarray(WEIGHTS[:features]) + 1.0 + generator.normal(0.0, 0.1, size=rows)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sample-{seed}.csv"
    frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(features)]).assign(y=y)
    frame.to_csv(path, index=False)
    return path


class RegressionTask:
    name = "linear-regression"
    raw_suffixes = (".csv",)
    metrics = MetricSet(
        (
            Metric("mse", "lower", "mean squared error"),
            Metric("mae", "lower", "mean absolute error"),
            Metric("r2", "higher", "coefficient of determination"),
        )
    )
    default_primary_metric = "mse"

    def __init__(self, features: int = 3) -> None:
        if not isinstance(features, int) or not 1 <= features <= len(WEIGHTS):
            raise ValueError(f"features {features!r}: expected 1 to {len(WEIGHTS)}")
        self.features = features
        self.columns = [f"x{i}" for i in range(features)]

    def options(self) -> Mapping[str, Any]:
        return {"features": self.features}

    # -- data ------------------------------------------------------------------------------------------

    def _read(self, folder: Path) -> list[list[float]]:
        rows = []
        for path in sorted(Path(folder).glob("*.csv")):
            with path.open(newline="") as handle:
                for record in csv.DictReader(handle):
                    rows.append([float(record[name]) for name in [*self.columns, "y"]])
        return rows

    def prepare(self, raw: Path, out: Path, *, previous: Path | None, split: Any) -> str:
        rows = self._read(raw)
        bounds = (split.train, split.train + split.validation)
        parts: dict[str, list[list[float]]] = {name: [] for name in SPLITS}
        for row in rows:
            key = ",".join(f"{value:.17g}" for value in row)
            position = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
            parts[SPLITS[sum(position >= bound for bound in bounds)]].append(row)
        out.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(json.dumps([self.features, bounds]).encode())
        for name, part in parts.items():
            buffer = io.BytesIO()
            np.save(buffer, np.asarray(part, dtype=np.float64).reshape(-1, self.features + 1))
            (out / f"{name}.npy").write_bytes(buffer.getvalue())
            digest.update(buffer.getvalue())
        version = "dv-" + digest.hexdigest()[:16]
        (out / "manifest.json").write_text(json.dumps({"data_version": version, "features": self.features}))
        return version

    def load(self, data_dir: Path) -> TaskData:
        manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
        splits = {}
        for name in SPLITS:
            table = torch.from_numpy(np.load(Path(data_dir) / f"{name}.npy")).float()
            splits[name] = TensorSplit(table[:, :-1].contiguous(), table[:, -1].contiguous())
        return TaskData(manifest["data_version"], splits, {"features": manifest["features"]})

    # -- the model -------------------------------------------------------------------------------------

    def build_model(self, info: Mapping[str, Any]) -> nn.Module:
        return nn.Linear(int(info["features"]), 1)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x).squeeze(-1), y)

    def score(self, model: nn.Module, split: Any) -> dict[str, float]:
        x, y = split[torch.arange(len(split))]
        predicted = model(x).squeeze(-1)
        mse = nn.functional.mse_loss(predicted, y).item()
        return {
            "mse": mse,
            "mae": (predicted - y).abs().mean().item(),
            "r2": 1.0 - mse / y.var(unbiased=False).item(),
        }

    # -- serving and drift -----------------------------------------------------------------------------

    def input_example(self, data: TaskData) -> Any:
        x, _ = data.split("test")[torch.arange(3)]
        return pd.DataFrame(x.double().numpy(), columns=self.columns)

    def predict(self, model: nn.Module, info: Mapping[str, Any], inputs: Any) -> Any:
        frame = inputs if isinstance(inputs, pd.DataFrame) else pd.DataFrame(inputs, columns=self.columns)
        x = torch.tensor(frame[self.columns].to_numpy(dtype=np.float32))
        return model(x).squeeze(-1).numpy()

    def drift_features(self, source: Path, *, prepared: bool) -> FeatureTable:
        if prepared:
            values = np.load(Path(source) / "train.npy")[:, :-1]
        else:
            values = np.asarray(self._read(source), dtype=np.float64).reshape(-1, self.features + 1)[:, :-1]
        return FeatureTable(tuple(self.columns), values)
