"""Snapshots of training state into reusable host buffers.

Taking a checkpoint must not make training wait for the disk, so the state is first copied ("staged")
into buffers that training never touches, and only those are serialised and written. The buffers are
allocated once and reused: a fresh 100 MB allocation per save costs page faults, a reused one a memcpy.

Staging is split in two: `plan` walks the state synchronously (cheap: it only collects references and
copies small non-tensor values), and `copy` moves the tensor bytes, which may run in a background thread
as long as nobody mutates the referenced tensors until it is done.

A sharded tensor (FSDP's `DTensor`) is staged as its local shard only, and comes back as a `DTensor` of the
same placement around the host buffer, as `torch.distributed.checkpoint` stages one: the sharded layout
writes each rank's shard, and no rank ever holds more than its own.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

_Path = tuple[Any, ...]


@dataclass(frozen=True)
class StagingPlan:
    """The state's structure, with every tensor leaf still pointing at the live tensor."""

    skeleton: Any
    tensors: list[tuple[_Path, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(_local(tensor).numel() * tensor.element_size() for _, tensor in self.tensors)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


class SnapshotStager:
    """Copies training state into host buffers it keeps between saves."""

    def __init__(self) -> None:
        self._buffers: dict[_Path, torch.Tensor] = {}

    def plan(self, state: Mapping[str, Any]) -> StagingPlan:
        tensors: list[tuple[_Path, torch.Tensor]] = []
        skeleton = _walk(state, (), tensors)
        return StagingPlan(skeleton=skeleton, tensors=tensors)

    def copy(self, plan: StagingPlan) -> dict[str, Any]:
        """Copy the planned tensors into the buffers; returns the state made of buffers."""
        staged: dict[_Path, torch.Tensor] = {}
        for path, tensor in plan.tensors:
            local = _local(tensor)
            buffer = self._buffer_for(path, local)
            buffer.copy_(local.detach(), non_blocking=buffer.is_pinned())
            staged[path] = (
                DTensor(buffer, tensor._spec, requires_grad=False) if isinstance(tensor, DTensor) else buffer
            )
        if any(_local(tensor).is_cuda for _, tensor in plan.tensors):
            torch.cuda.synchronize()
        return _fill(plan.skeleton, staged)

    def _buffer_for(self, path: _Path, tensor: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
            self._buffers[path] = buffer
        return buffer


class _TensorSlot:
    def __init__(self, path: _Path) -> None:
        self.path = path


def _walk(node: Any, path: _Path, tensors: list[tuple[_Path, torch.Tensor]]) -> Any:
    if isinstance(node, torch.Tensor):
        tensors.append((path, node))
        return _TensorSlot(path)
    if isinstance(node, Mapping):
        return {key: _walk(value, (*path, key), tensors) for key, value in node.items()}
    if isinstance(node, list | tuple):
        items = [_walk(value, (*path, index), tensors) for index, value in enumerate(node)]
        return items if isinstance(node, list) else tuple(items)
    return copy.deepcopy(node)


def _fill(node: Any, staged: Mapping[_Path, torch.Tensor]) -> Any:
    if isinstance(node, _TensorSlot):
        return staged[node.path]
    if isinstance(node, dict):
        return {key: _fill(value, staged) for key, value in node.items()}
    if isinstance(node, list):
        return [_fill(value, staged) for value in node]
    if isinstance(node, tuple):
        return tuple(_fill(value, staged) for value in node)
    return node
