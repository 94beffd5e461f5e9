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

`copy` may be told which buffers to fill, in which order: in the sharded layout a rank writes only its
share of the tensors every rank holds alike (DDP's replica is split between the ranks), so it copies
that share, in the order it writes it, and not the rest: half the copy's time and memory traffic on two
ranks, taken from the writer's CPU otherwise. `filled_state()` is the staged state without the tensors
left unfilled, for a check of what is written.

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
    """A staged state whose buffers are being filled.

    `state` has its final structure at once (buffers, and `DTensor`s around them), so that a writer can plan
    its write before the bytes are there; `wait(tensor)` blocks until the buffer `tensor` lies in is filled
    (and raises the copy's error if it failed, or if the copy ended without filling it).
    """

    def __init__(self, state: dict[str, Any], buffers: list[torch.Tensor]) -> None:
        self.state = state
        # Which buffer a tensor lies in, by its storage: a writer gets views of the buffers (a DTensor's
        # local shard), not the buffer objects. An empty buffer has no storage to wait for.
        self._index = {_storage(buffer): i for i, buffer in enumerate(buffers) if buffer.numel()}
        self._filled = [False] * len(buffers)
        self._ended = False
        self._error: BaseException | None = None
        self._changed = threading.Condition()

    def buffers_of(self, tensors: list[torch.Tensor]) -> list[int]:
        """The buffers `tensors` lie in, each once, in the order of `tensors` (empty tensors have none)."""
        found = (self._index.get(_storage(tensor)) for tensor in tensors if tensor.numel())
        return list(dict.fromkeys(index for index in found if index is not None))

    def wait(self, tensor: torch.Tensor) -> None:
        index = self._index.get(_storage(tensor)) if tensor.numel() else None
        if index is None:
            return
        with self._changed:
            self._changed.wait_for(lambda: self._filled[index] or self._ended or self._error is not None)
            if self._filled[index]:
                return
            if self._error is not None:
                raise self._error
        raise RuntimeError(f"staged buffer {index} was not in the copy's order: its bytes were never copied")

    def filled_state(self) -> dict[str, Any]:
        """`state` without the tensors the copy left unfilled (the whole state when it filled all)."""
        with self._changed:
            filled = list(self._filled)
        if all(filled):
            return self.state
        buffers = {storage: filled[index] for storage, index in self._index.items()}
        return _without_unfilled(self.state, buffers)

    def _advance(self, indices: list[int]) -> None:
        with self._changed:
            for index in indices:
                self._filled[index] = True
            self._changed.notify_all()

    def _end(self) -> None:
        with self._changed:
            self._ended = True
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

    def copy(self, plan: StagingPlan, snapshot: Snapshot, order: list[int] | None = None) -> None:
        """Copy the planned tensors into the snapshot's buffers, telling it as each is filled: the buffers
        `order` names, in that order (indices into `plan.tensors`), or all of them."""
        indices = list(range(len(plan.tensors))) if order is None else order
        try:
            on_device = any(_local(tensor).is_cuda for _, tensor in plan.tensors)
            for index in indices:
                path, tensor = plan.tensors[index]
                buffer = self._buffers[path]
                buffer.copy_(_local(tensor).detach(), non_blocking=buffer.is_pinned())
                if not on_device:
                    snapshot._advance([index])
            if on_device:  # the copies into pinned memory are asynchronous: every one is done after this
                torch.cuda.synchronize()
                snapshot._advance(indices)
        except BaseException as error:
            snapshot._fail(error)
            raise
        finally:
            snapshot._end()

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


def _without_unfilled(node: Any, filled: Mapping[int, bool]) -> Any:
    """`node` with every tensor whose buffer is unfilled left out (an empty tensor has no buffer: kept)."""
    if isinstance(node, torch.Tensor):
        return node if not node.numel() or filled.get(_storage(node), True) else _LEFT_OUT
    if isinstance(node, dict):
        kept = {key: _without_unfilled(value, filled) for key, value in node.items()}
        return {key: value for key, value in kept.items() if value is not _LEFT_OUT}
    if isinstance(node, list | tuple):
        items = [
            item for item in (_without_unfilled(value, filled) for value in node) if item is not _LEFT_OUT
        ]
        return items if isinstance(node, list) else tuple(items)
    return node


_LEFT_OUT = object()


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
