"""The optimizer and its learning-rate schedule: the task's own, if it brings them, else the engine's default.

A task may own its optimisation (`configure_optimization` in training/tasks/base.py, checked there). Without
it, the default is AdamW with `--learning-rate` and `--weight-decay`, the learning rate rising linearly over
`--warmup-steps` steps, then falling along a cosine to a tenth of itself at the last step. Either way the
schedule advances once per optimizer step (once per global step, whatever `--accumulate-grad-batches`), and
both objects' states are checkpointed and restored (training/engine/train_state.py), so a resumed run goes
on with the same learning rate and moments.

What was used is recorded: `describe` names the optimizer and scheduler classes and where they came from,
for metadata.json and the MLflow run's parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from training.engine.config import TrainConfig
from training.tasks.base import OptimizationSettings, Task, configured_optimization

DEFAULT, TASK = "default", "task"  # where the optimisation came from


def warmup_cosine(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warm-up, then cosine decay to 10% over the remaining steps."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


@dataclass
class Optimization:
    """The optimizer, its schedule (None: a constant learning rate) and their origin (DEFAULT or TASK)."""

    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler | None
    source: str

    def learning_rate(self) -> float:
        """The learning rate the next step uses (the first parameter group's)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def advance_schedule(self) -> None:
        """After each optimizer step (a float16 step the gradient scaler skipped included: the schedule
        follows the global step, as the data does)."""
        if self.scheduler is not None:
            self.scheduler.step()

    def describe(self) -> dict[str, Any]:
        return {
            "optimizer": type(self.optimizer).__name__,
            "lr_scheduler": type(self.scheduler).__name__ if self.scheduler is not None else None,
            "optimization_source": self.source,
        }


def settings_for(config: TrainConfig, total_steps: int) -> OptimizationSettings:
    return OptimizationSettings(
        total_steps=total_steps,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_steps,
    )


def build_optimization(task: Task, model: nn.Module, config: TrainConfig, total_steps: int) -> Optimization:
    """The task's optimisation, or the default; `model` is on its device already."""
    settings = settings_for(config, total_steps)
    owned = configured_optimization(task, model, settings)
    if owned is not None:
        return Optimization(*owned, source=TASK)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay
    )
    scheduler = LambdaLR(optimizer, warmup_cosine(settings.warmup_steps, total_steps))
    return Optimization(optimizer, scheduler, source=DEFAULT)
