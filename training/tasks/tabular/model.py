"""The tabular model: a multilayer perceptron over a table's encoded row, carrying everything it needs to
read one: each numeric feature's train mean and standard deviation, each categorical feature's embedding
table, and, for a regression, the target's mean and standard deviation.

It reads the encoding of training/tasks/tabular/encoding.py. A numeric or boolean feature is normalised,
a missing one becomes 0 (the train mean), and a feature that was ever missing in the data also gets an
indicator input saying so, learned like any other (one never missing has none: it would always be 0).
A categorical feature is an embedding: row 0 for a missing value, row 1 for a category training never
saw (new at serving, past `max_categories`, or found only in the validation or test rows), one row per
category with train rows. So a saved or registered model scores an encoded row with no other artefact.

A classifier's output is one logit per class; a regressor's is the target in its own units (the network
predicts it standardised, and the model scales it back, so training sees a well-conditioned loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn

from core.errors import InputError

MISSING_ROW, UNSEEN_ROW, FIRST_CATEGORY_ROW = 0, 1, 2
MAX_EMBEDDING_WIDTH = 32


def embedding_width(categories: int) -> int:
    """A width that grows slowly with the categories (fast.ai's rule of thumb), at most 32."""
    return max(2, min(MAX_EMBEDDING_WIDTH, round(1.6 * (categories + FIRST_CATEGORY_ROW) ** 0.56)))


@dataclass(frozen=True)
class ModelConfig:
    n_features: int
    n_classes: int  # 1 for a regression: one output
    hidden_width: int = 256
    hidden_layers: int = 2
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.n_features < 1 or self.n_classes < 1:
            raise InputError(
                f"model needs at least 1 feature and 1 output, got {self.n_features} features and "
                f"{self.n_classes} outputs; check the prepared data's schema"
            )
        if self.hidden_width < 1:
            raise InputError(f"task option hidden_width {self.hidden_width!r}: expected a positive integer")
        if self.hidden_layers < 1:
            raise InputError(f"task option hidden_layers {self.hidden_layers!r}: expected a positive integer")
        if not 0.0 <= self.dropout < 1.0:
            raise InputError(f"task option dropout {self.dropout!r}: expected a probability in [0, 1)")

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)


class TabularModel(nn.Module):
    """`categories[j]` is, per categorical feature `j` (at `categorical[j]`), each code's train rows: a
    code with none shares the unseen row. `indicated` are the features that get a missing indicator.
    `target` is a regression's (mean, std), None for a classifier."""

    def __init__(
        self,
        config: ModelConfig,
        feature_mean: torch.Tensor,
        feature_std: torch.Tensor,
        categorical: Sequence[int] = (),
        categories: Sequence[Sequence[int]] = (),
        target: tuple[float, float] | None = None,
        indicated: Sequence[int] = (),
    ) -> None:
        super().__init__()
        self.config = config
        numeric = [position for position in range(config.n_features) if position not in set(categorical)]
        # What the data's info decides (which column is what, the target's scale) is rebuilt from it, not
        # saved: the state dict holds the learned weights and the normalisation alone, as it always has.
        self.register_buffer("numeric", torch.tensor(numeric, dtype=torch.long), persistent=False)
        self.register_buffer(
            "categorical", torch.tensor(list(categorical), dtype=torch.long), persistent=False
        )
        self.register_buffer("feature_mean", feature_mean.detach().clone().float()[numeric])
        self.register_buffer("feature_std", feature_std.detach().clone().float()[numeric])
        flags = [slot for slot, position in enumerate(numeric) if position in set(indicated)]
        self.register_buffer("indicated", torch.tensor(flags, dtype=torch.long), persistent=False)
        self.rows = nn.ModuleList()
        self.embeddings = nn.ModuleList()
        self._code_buffers: list[str] = []
        for slot, counts in enumerate(categories):
            seen = torch.tensor([count > 0 for count in counts], dtype=torch.bool)
            rows = torch.where(seen, torch.arange(len(counts)) + FIRST_CATEGORY_ROW, UNSEEN_ROW)
            name = f"category_rows_{slot}"
            self.register_buffer(name, rows.long(), persistent=False)
            self._code_buffers.append(name)
            self.embeddings.append(
                nn.Embedding(len(counts) + FIRST_CATEGORY_ROW, embedding_width(len(counts)))
            )
        mean, std = target if target is not None else (0.0, 1.0)
        self.register_buffer("target_mean", torch.tensor(float(mean)), persistent=False)
        self.register_buffer("target_std", torch.tensor(float(std) if std > 0 else 1.0), persistent=False)
        self.regression = target is not None
        width_in = len(numeric) + len(flags) + sum(embedding.embedding_dim for embedding in self.embeddings)
        layers: list[nn.Module] = []
        for _ in range(config.hidden_layers):
            layers += [nn.Linear(width_in, config.hidden_width), nn.GELU(), nn.Dropout(config.dropout)]
            width_in = config.hidden_width
        layers.append(nn.Linear(width_in, config.n_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        numbers = features.index_select(1, self.numeric)
        missing = torch.isnan(numbers)
        scaled = torch.where(
            missing, torch.zeros_like(numbers), (numbers - self.feature_mean) / self.feature_std
        )
        inputs = [scaled, missing.index_select(1, self.indicated).to(scaled.dtype)]
        for slot, embedding in enumerate(self.embeddings):
            codes = features[:, self.categorical[slot]]
            rows: torch.Tensor = getattr(self, self._code_buffers[slot])
            held = (codes >= 0) & (codes < len(rows))  # NaN compares false: missing is not held
            index = rows[torch.where(held, codes, torch.zeros_like(codes)).long()]
            index = torch.where(held, index, torch.full_like(index, UNSEEN_ROW))
            index = torch.where(torch.isnan(codes), torch.full_like(index, MISSING_ROW), index)
            inputs.append(embedding(index))
        output = self.layers(torch.cat(inputs, dim=1))
        if self.regression:
            return output.squeeze(-1) * self.target_std + self.target_mean
        return output


def parameter_count(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())
