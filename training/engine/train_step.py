"""One optimizer step: a rank's share of the global batch in `--accumulate-grad-batches` micro-batches.

Each rank's share is cut into K equal, contiguous micro-batches (training/engine/batch_split.py refuses a
share that does not split evenly). Each micro-batch's loss is scaled by 1/K before `backward`, so the
accumulated gradient is that of the share's mean loss: the step is the one the same global batch makes
without accumulation, up to floating-point summation order. Under DDP the ranks synchronise their
gradients only on the last micro-batch (`no_sync()` for the first K-1), where DDP averages them (FSDP
likewise reduce-scatters only after the last: `set_requires_gradient_sync`); then the gradients' total
norm is clipped to `--grad-clip-norm` (over the whole model, after averaging, so every rank clips alike),
and the optimizer and the schedule step once.

A step is atomic: its K micro-batches all happen between two optimizer steps, and checkpoints are taken only
between steps. So a run stopped mid-accumulation (killed, or evicted) resumes at the first micro-batch of
that global step, from the checkpoint of a step boundary, and loses nothing but the interrupted work. The
micro-batches are as deterministic as whole batches: the samples come from the step's global indices
(training/engine/sampling.py), and the random stream, seeded once per step from (seed, step, rank), is
drawn by the micro-batches in order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from training.engine.batches import BatchSource
from training.engine.optimization import Optimization
from training.engine.precision import Precision
from training.tasks.base import Task, batch_loss


class TrainStep:
    """How every step of one attempt is computed: the task's loss, accumulation, precision, clipping."""

    def __init__(
        self,
        task: Task,
        batches: BatchSource,
        optimization: Optimization,
        precision: Precision,
        *,
        accumulate_grad_batches: int,
        grad_clip_norm: float | None,
        loss_info: Mapping[str, Any] | None,
    ) -> None:
        self._task = task
        self._batches = batches
        self._optimization = optimization
        self._precision = precision
        self._accumulate = accumulate_grad_batches
        self._clip = grad_clip_norm
        self._loss_info = loss_info  # the data's info, for a loss that takes it; else None

    def run(self, network: nn.Module, indices: torch.Tensor, before_update: Callable[[], None]) -> float:
        """Train `network` (the model, DDP-wrapped or not) on the rank's `indices`; returns their mean loss.
        `before_update` runs after the gradients are complete and before the weights change."""
        optimizer = self._optimization.optimizer
        optimizer.zero_grad(set_to_none=True)
        network.train()
        losses = []
        parts = indices.chunk(self._accumulate)
        for number, part in enumerate(parts, start=1):
            batch = self._batches.batch(part)
            accumulating = isinstance(network, DistributedDataParallel) and number < len(parts)
            if isinstance(network, FSDPModule):  # FSDP's no_sync: reduce-scatter once, after the last
                network.set_requires_gradient_sync(number == len(parts))
            with network.no_sync() if accumulating else contextlib.nullcontext():  # type: ignore[operator]
                with self._precision.autocast():
                    loss = batch_loss(self._task, network, batch, self._loss_info)
                self._precision.backward(loss if self._accumulate == 1 else loss / self._accumulate)
            losses.append(loss.detach())
        if self._clip is not None:
            self._precision.unscale(optimizer)
            torch.nn.utils.clip_grad_norm_(network.parameters(), self._clip)
        before_update()
        self._precision.step(optimizer)
        self._optimization.advance_schedule()
        return (torch.stack(losses).float().mean() if len(losses) > 1 else losses[0]).item()
