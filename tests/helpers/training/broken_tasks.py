"""Users' tasks with the bugs a first month finds: the built-in tabular classifier, with one method that
breaks the contract (training/tasks/base.py) or crashes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from training.tasks.tabular.task import TabularTask


class VectorLoss(TabularTask):
    """`loss` returns the per-sample losses, not their mean."""

    name = "vector-loss"

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        features, labels = batch
        return nn.functional.cross_entropy(model(features), labels, reduction="none")


class FunctionModel(TabularTask):
    """`build_model` returns a function, not a module."""

    name = "function-model"

    def build_model(self, info: Mapping[str, Any]) -> Any:
        return lambda features: features


class CrashingLoss(TabularTask):
    """`loss` fails with an exception of its own (a typo'd key, say)."""

    name = "crashing-loss"

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return {"loss": super().loss(model, batch)}["los"]
