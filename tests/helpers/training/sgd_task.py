"""A user's task that owns its optimisation: the built-in tabular task, trained by SGD with momentum on a
step schedule (`configure_optimization`, training/tasks/base.py), with a loss that takes the data's `info`.

Loaded by reference (`--task tests/helpers/training/sgd_task.py:SgdTabular`), as a user's file is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from training.tasks.base import OptimizationSettings
from training.tasks.tabular.task import TabularTask

LEARNING_RATE = 0.05
STEP_SIZE = 10  # the learning rate halves every 10 optimizer steps
GAMMA = 0.5


def step_schedule(step: int) -> float:
    """The learning rate StepLR gives the step after `step` steps."""
    return LEARNING_RATE * GAMMA ** (step // STEP_SIZE)


class SgdTabular(TabularTask):
    name = "tabular-sgd"

    def configure_optimization(
        self, model: nn.Module, settings: OptimizationSettings
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9)
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=GAMMA)

    def loss(self, model: nn.Module, batch: Any, info: Mapping[str, Any]) -> torch.Tensor:
        features, labels = batch
        logits = model(features)
        if logits.shape[-1] != info["n_classes"]:  # the data's facts, given as `info`
            raise ValueError(f"{logits.shape[-1]} outputs for {info['n_classes']} classes")
        return nn.functional.cross_entropy(logits, labels)
