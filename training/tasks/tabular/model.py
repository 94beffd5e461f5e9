"""The classifier: a multilayer perceptron that carries its own input normalisation.

The feature mean and standard deviation of the training split live in the model as buffers, so a saved or
registered model scores raw feature vectors without any separate preprocessing artefact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from core.errors import InputError


@dataclass(frozen=True)
class ModelConfig:
    n_features: int
    n_classes: int
    hidden_width: int = 256
    hidden_layers: int = 2
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.n_features < 1 or self.n_classes < 2:
            raise InputError(
                f"model needs at least 1 feature and 2 classes, got {self.n_features} features and "
                f"{self.n_classes} classes; check the prepared data's schema"
            )
        if self.hidden_width < 1:
            raise InputError(f"task option hidden_width {self.hidden_width!r}: expected a positive integer")
        if self.hidden_layers < 1:
            raise InputError(f"task option hidden_layers {self.hidden_layers!r}: expected a positive integer")
        if not 0.0 <= self.dropout < 1.0:
            raise InputError(f"task option dropout {self.dropout!r}: expected a probability in [0, 1)")

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)


class TabularClassifier(nn.Module):
    def __init__(self, config: ModelConfig, feature_mean: torch.Tensor, feature_std: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        self.register_buffer("feature_mean", feature_mean.detach().clone().float())
        self.register_buffer("feature_std", feature_std.detach().clone().float())
        layers: list[nn.Module] = []
        width_in = config.n_features
        for _ in range(config.hidden_layers):
            layers += [nn.Linear(width_in, config.hidden_width), nn.GELU(), nn.Dropout(config.dropout)]
            width_in = config.hidden_width
        layers.append(nn.Linear(width_in, config.n_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers((features - self.feature_mean) / self.feature_std)


def parameter_count(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())
