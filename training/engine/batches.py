"""Batches of any task's map-style split, by the engine's global sample indices, on the device.

A split that takes a tensor of indices (`TensorSplit` and the like) answers a whole batch with one gather:
the fast path. Any other map-style split is asked one sample at a time and batched with torch's
`default_collate`, as a DataLoader would. Either way the samples are exactly those the sampler chose,
which is what makes a resumed run continue bitwise where it stopped.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import default_collate

from core.errors import InputError
from training.tasks.base import TensorSplit


def on_device(split: Any, device: torch.device) -> Any:
    """A split held in tensors moves to the device once, so each batch is a gather there."""
    if isinstance(split, TensorSplit) and device.type != "cpu":
        return TensorSplit(split.inputs.to(device), split.targets.to(device), split.keys)
    return split


def to_device(batch: Any, device: torch.device) -> Any:
    """A batch (a tensor, or tuples, lists and dicts of them) on `device`; anything else as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(item, device) for item in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(item, device) for item in batch)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    return batch


class BatchSource:
    """Batches of one split for one device; `task_ref` names the task in errors."""

    def __init__(self, split: Any, device: torch.device, task_ref: str) -> None:
        self.split = on_device(split, device)
        self.device = device
        self.task_ref = task_ref
        self._by_tensor: bool | None = None  # learnt at the first batch

    def __len__(self) -> int:
        return len(self.split)

    def batch(self, indices: torch.Tensor) -> Any:
        if self._by_tensor is not False:
            try:
                batch = self.split[indices]
            except (TypeError, IndexError):
                if self._by_tensor:
                    raise
                self._by_tensor = False
            else:
                self._by_tensor = True
                return to_device(batch, self.device)
        try:
            batch = default_collate([self.split[index] for index in indices.tolist()])
        except (TypeError, IndexError, RuntimeError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise InputError(
                f"--task {self.task_ref!r}: its train split cannot be batched ({type(error).__name__}: "
                f"{reason}); expected split[int] to return a tensor, or a tuple or dict of tensors, of "
                "the same shape for every sample"
            ) from error
        return to_device(batch, self.device)
