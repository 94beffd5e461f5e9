"""Snapshots of training state into reusable host buffers.

Taking a checkpoint must not make training wait for the disk, so the state is first copied ("staged")
into buffers that training never touches, and only those are serialised and written. The buffers are
allocated once and reused: a fresh 100 MB allocation per save costs page faults, a reused one a memcpy.

Staging is split in three: `plan` walks the state synchronously (cheap: it only collects references and
copies small non-tensor values); `snapshot` makes the staged state, its buffers not yet filled; and `copy`
moves the tensor bytes, one tensor after another, which may run in a background thread as long as nobody
mutates the referenced tensors until it is done. The snapshot says which buffers are filled (`wait`), so
that a writer can write each tensor as soon as it is staged, while the next one is copied, instead of
waiting for the whole copy: the save takes about as long as the write alone, not the copy and then the
write.

A sharded tensor (FSDP's `DTensor`) is staged as its local shard only, and comes back as a `DTensor` of the
same placement around the host buffer, as `torch.distributed.checkpoint` stages one: the sharded layout
writes each rank's shard, and no rank ever holds more than its own.
"""

from __future__ import annotations

import copy
import threading
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


def _storage(tensor: torch.Tensor) -> int:
    return _local(tensor).untyped_storage().data_ptr()


class Snapshot:
    """A staged state whose buffers are being filled, in the plan's order.

    `state` has its final structure at once (buffers, and `DTensor`s around them), so that a writer can plan
    its write before the bytes are there; `wait(tensor)` blocks until the buffer `tensor` lies in is filled
    (and raises the copy's error if it failed), `wait_all()` until every one is.
    """

    def __init__(self, state: dict[str, Any], buffers: list[torch.Tensor]) -> None:
        self.state = state
        # Which buffer a tensor lies in, by its storage: a writer gets views of the buffers (a DTensor's
        # local shard), not the buffer objects. An empty buffer has no storage to wait for.
        self._index = {_storage(buffer): i for i, buffer in enumerate(buffers) if buffer.numel()}
        self._count = len(buffers)
        self._filled = 0
        self._error: BaseException | None = None
        self._changed = threading.Condition()

    def wait(self, tensor: torch.Tensor) -> None:
        index = self._index.get(_storage(tensor)) if tensor.numel() else None
        self._wait_for(index + 1 if index is not None else 0)

    def wait_all(self) -> None:
        self._wait_for(self._count)

    def _wait_for(self, count: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._filled >= count or self._error is not None)
            if self._filled < count and self._error is not None:
                raise self._error

    def _advance(self, filled: int) -> None:
        with self._changed:
            self._filled = filled
            self._changed.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self._changed:
            self._error = error
            self._changed.notify_all()


class SnapshotStager:
    """Copies training state into host buffers it keeps between saves."""

    def __init__(self) -> None:
        self._buffers: dict[_Path, torch.Tensor] = {}

    def plan(self, state: Mapping[str, Any]) -> StagingPlan:
        tensors: list[tuple[_Path, torch.Tensor]] = []
        skeleton = _walk(state, (), tensors)
        return StagingPlan(skeleton=skeleton, tensors=tensors)

    def snapshot(self, plan: StagingPlan) -> Snapshot:
        """The state made of this plan's buffers, not yet filled (`copy` fills them)."""
        staged: dict[_Path, torch.Tensor] = {}
        buffers: list[torch.Tensor] = []
        for path, tensor in plan.tensors:
            buffer = self._buffer_for(path, _local(tensor))
            buffers.append(buffer)
            staged[path] = (
                DTensor(buffer, tensor._spec, requires_grad=False) if isinstance(tensor, DTensor) else buffer
            )
        return Snapshot(_fill(plan.skeleton, staged), buffers)

    def copy(self, plan: StagingPlan, snapshot: Snapshot) -> None:
        """Copy the planned tensors into the snapshot's buffers, telling it as each is filled."""
        try:
            on_device = any(_local(tensor).is_cuda for _, tensor in plan.tensors)
            for index, (path, tensor) in enumerate(plan.tensors):
                buffer = self._buffers[path]
                buffer.copy_(_local(tensor).detach(), non_blocking=buffer.is_pinned())
                if not on_device:
                    snapshot._advance(index + 1)
            if on_device:  # the copies into pinned memory are asynchronous: every one is done after this
                torch.cuda.synchronize()
                snapshot._advance(len(plan.tensors))
        except BaseException as error:
            snapshot._fail(error)
            raise

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
