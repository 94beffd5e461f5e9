"""What the ranks agree on after each step, without a barrier in the training loop.

Every rank contributes its loss and its vote on whether an eviction notice arrived; in the sharded
checkpoint layout rank 0 adds its vote for a save due by time, so that every rank saves at the same step.
The exchange is one asynchronous all-reduce, started when a step ends and read when the next step ends;
by then it has long completed behind that step's computation. A synchronous exchange would add a barrier
per step, making every rank wait for the slowest one's optimizer step as well as for its gradients, which
cost about 4% throughput on the benchmark.

The price is one step of latency, the same on every rank: a stop vote cast during step k is read by all
ranks at the end of step k+1, so all of them stop, and save, after step k+1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from training.engine.distributed import DistContext


@dataclass(frozen=True)
class StepVerdict:
    """The agreed outcome of one step."""

    step: int
    mean_loss: float
    stop_requested: bool
    details: dict[str, Any]
    save_requested: bool = False


@dataclass
class _Exchange:
    step: int
    values: torch.Tensor
    work: Any  # torch.distributed.Work, or None for a single process
    details: dict[str, Any]


class StepConsensus:
    def __init__(self, context: DistContext) -> None:
        self._context = context
        self._pending: _Exchange | None = None

    def exchange(
        self,
        step: int,
        loss: float,
        stop_vote: bool,
        details: dict[str, Any] | None = None,
        save_vote: bool = False,
    ) -> StepVerdict | None:
        """Contribute step `step`; returns the verdict on the step before it (None after the first)."""
        previous = self.drain()
        values = torch.tensor(
            [loss, 1.0 if stop_vote else 0.0, 1.0 if save_vote else 0.0],
            dtype=torch.float64,
            device=self._context.device,
        )
        work = dist.all_reduce(values, async_op=True) if self._context.is_distributed else None
        self._pending = _Exchange(step, values, work, details or {})
        return previous

    def drain(self) -> StepVerdict | None:
        """The verdict on the last contributed step, waiting for it if need be (None if there is none)."""
        verdict, self._pending = self.settle(), None
        return verdict

    def settle(self) -> StepVerdict | None:
        """The verdict on the last contributed step, now, without consuming it: the next `exchange` or
        `drain` still returns it. For one rank that must know before it acts alone (rank 0, before it saves
        the state of that step): every rank has already started this exchange, so waiting for it blocks
        this rank only, and only until the slowest rank has finished the same step."""
        pending = self._pending
        if pending is None:
            return None
        if pending.work is not None:
            pending.work.wait()
            pending.work = None
        loss_sum, votes, save_votes = pending.values.tolist()
        return StepVerdict(
            pending.step, loss_sum / self._context.world_size, votes > 0, pending.details, save_votes > 0
        )
