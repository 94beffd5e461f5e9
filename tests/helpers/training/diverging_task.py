"""A user's task whose training diverges at a chosen step: the built-in tabular classifier, with a loss that
goes wrong there, as a bad batch or a too-large learning rate makes a real one go wrong.

Options, besides the tabular task's own:
- `diverge_at_step`: the step whose loss goes wrong, counted as the step events count (1 is the first
  step). The task counts its own `loss` calls, one per step, so this holds for a run started from scratch.
- `poison`: `"inf"`, the loss is infinite from that step on (its gradients, and so the weights, turn NaN);
  `"gradient"`, the loss stays finite at that step but its gradients are NaN (as a square root at 0 makes
  them), so only the weights its update leaves show it.
- `ranks`: the ranks whose loss goes wrong (default: every rank); the others' stays finite.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from training.tasks.tabular.task import TabularTask

POISONS = ("inf", "gradient")


class DivergingTabular(TabularTask):
    name = "diverging-tabular"

    def __init__(
        self, diverge_at_step: int, poison: str = "inf", ranks: list[int] | None = None, **tabular: Any
    ) -> None:
        super().__init__(**tabular)
        if poison not in POISONS:
            raise ValueError(f"poison {poison!r}: expected one of {POISONS}")
        self.diverge_at_step, self.poison, self.ranks = diverge_at_step, poison, ranks
        self._steps_seen = 0

    def options(self) -> Mapping[str, Any]:
        own = {"diverge_at_step": self.diverge_at_step, "poison": self.poison, "ranks": self.ranks}
        return {**super().options(), **own}

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        loss = super().loss(model, batch)
        self._steps_seen += 1
        rank = int(os.environ.get("RANK", "0"))
        if self._steps_seen < self.diverge_at_step or (self.ranks is not None and rank not in self.ranks):
            return loss
        if self.poison == "inf":
            return loss * float("inf")
        # 0 * sqrt(u) at u = 0 is 0, but its derivative is 0 * inf: NaN, through every weight.
        weights = sum(parameter.sum() for parameter in model.parameters())
        return loss + 0.0 * torch.sqrt(weights * 0.0)
