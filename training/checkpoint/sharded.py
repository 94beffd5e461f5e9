"""Sharded checkpoints: `torch.distributed.checkpoint` (DCP) reading and writing through a `CheckpointStore`.

Under FSDP no rank holds the whole state, and under DDP one rank writing everything leaves the others idle,
so in the sharded layout every rank writes its own part of the checkpoint, in parallel. DCP plans who
writes what (each tensor chunk once: a DTensor's local shard by its owner, a replicated tensor by one rank
of those holding it) and, on load, who reads which byte ranges, for any world size: that is how a
checkpoint written by N ranks resumes on M. This module is the storage layer under DCP, on the same store
seam as the single-file layout, so a local folder and Blob Storage behave alike and nothing detours
through a local disk.

A sharded checkpoint `step-…-aNNN` is these objects:
- `<name>.shard-RRRRR`: rank R's write items, raw tensor bytes back to back (no per-tensor pickling), with a
  checksum computed while they stream to the store;
- `<name>.dcp`: DCP's metadata (which chunk of which tensor lies where), written by the coordinator once
  every rank's shard is durable;
- `<name>.json`: the commit record, written last by the checkpointer; it lists every object above with its
  size and checksum (training/checkpoint/records.py).

The checksum is CRC-32, the one zlib computes, by ISA-L (the `isal` package: the same values at 8-25 GB/s
on one core here, against zlib's 2-3 GB/s and sha256's 1.2 GB/s), so hashing costs a few milliseconds per
shard and never holds the save below the disk's speed. It guards against corruption in storage and
truncation, not against an adversary who can write the checkpoint location: that one could replace the
record too. The record names the algorithm.

Loading never unpickles arbitrary objects: the metadata and every non-tensor value are read with torch's
weights-only unpickler, as the single-file layout reads its checkpoint.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from isal.isal_zlib import crc32
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import (
    LoadPlan,
    LoadPlanner,
    Metadata,
    SavePlan,
    SavePlanner,
    StorageReader,
    StorageWriter,
)
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.tensor import DTensor
from torch.futures import Future

from core.errors import CheckpointError
from training.checkpoint.store import CheckpointStore, storage_failure

CHECKSUM = "crc32"
METADATA_SUFFIX = ".dcp"
SHARD_SUFFIX = ".shard-"


def shard_object(name: str, index: int) -> str:
    return f"{name}{SHARD_SUFFIX}{index:05d}"


@dataclass(frozen=True)
class ObjectSum:
    """One object of a sharded checkpoint as its record lists it."""

    size: int
    checksum: str  # hex digits of `CHECKSUM`

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, CHECKSUM: self.checksum}

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> ObjectSum:
        return cls(size=int(fields["size"]), checksum=str(fields[CHECKSUM]))


@dataclass(frozen=True)
class Piece:
    """Where one write item's bytes lie: in `object`, at `offset`, `length` bytes; a tensor's dtype and
    shape, so that its raw bytes become a tensor again (None for a pickled non-tensor value)."""

    object: str
    offset: int
    length: int
    dtype: str | None
    shape: tuple[int, ...] | None


class _Checksummed:
    """Writes to `target`, counting and checksumming what passes (a file's `OSError` passes through: the
    checkpointer reports its reason)."""

    def __init__(self, target: BinaryIO) -> None:
        self._target = target
        self.crc = 0
        self.size = 0

    def write(self, data: memoryview) -> None:
        self.crc = crc32(data, self.crc)
        self.size += len(data)
        self._target.write(data)

    def result(self) -> ObjectSum:
        return ObjectSum(self.size, f"{self.crc:08x}")


def checksum(data: bytes | memoryview) -> ObjectSum:
    return ObjectSum(len(data), f"{crc32(data):08x}")


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy when it is a contiguous CPU tensor (a staged buffer is)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(cast(Any, flat.view(torch.uint8).numpy())) if flat.numel() else memoryview(b"")


class StoreWriter(StorageWriter):
    """DCP's storage writer for checkpoint `name` in `store`; every rank has one, the coordinator (rank 0)
    writes the metadata. After `dcp.save` returns, the coordinator's `objects` lists what was written.

    The state may still be being staged as DCP plans and writes: `planned(tensors)` is called once the plan
    is agreed, with the tensors this rank will write, in order (the stager copies those from then on), and
    `ready(tensor)` blocks until a tensor's bytes are there.
    `refusal()`, asked once this rank's shard is written, is this rank's reason not to save (None to save),
    raised there, so that DCP fails the save on every rank (a rank that left `dcp.save` early would leave
    the others in its collectives)."""

    def __init__(
        self,
        store: CheckpointStore,
        name: str,
        ready: Callable[[torch.Tensor], None] = lambda tensor: None,
        refusal: Callable[[], BaseException | None] = lambda: None,
        planned: Callable[[list[torch.Tensor]], None] = lambda tensors: None,
    ) -> None:
        super().__init__()
        self._store = store
        self._name = name
        self._ready = ready
        self._refusal = refusal
        self._planned = planned
        self.objects: dict[str, ObjectSum] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        self.objects = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        # Each rank's shard is its own object, named by its rank in the group (its place in the global
        # plan). Not from the plan's `storage_data`: a reused plan carries an earlier checkpoint's name.
        self._rank = int(kwargs.get("rank", 0))

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        tensors = (planner.resolve_data(item) for item in plan.items if item.type != WriteItemType.BYTE_IO)
        self._planned([tensor for tensor in tensors if isinstance(tensor, torch.Tensor)])
        results: list[WriteResult] = []
        if plan.items:
            results = self._write_shard(shard_object(self._name, self._rank), plan.items, planner)
        refused = self._refusal()
        if refused is not None:
            raise refused
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _write_shard(self, name: str, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        pieces: list[tuple[WriteItem, Piece]] = []
        with self._store.writer(name) as target:
            out = _Checksummed(target)
            for item in items:
                data = planner.resolve_data(item)
                offset = out.size
                if item.type == WriteItemType.BYTE_IO:
                    assert isinstance(data, io.BytesIO)
                    out.write(data.getbuffer())
                    piece = Piece(name, offset, out.size - offset, None, None)
                else:
                    assert isinstance(data, torch.Tensor)
                    self._ready(data)
                    out.write(_tensor_bytes(data))
                    piece = Piece(name, offset, out.size - offset, str(data.dtype), tuple(data.shape))
                pieces.append((item, piece))
            total = out.result()
        # Every piece carries its object's sum too, so that the coordinator learns it from the results.
        return [
            WriteResult(index=item.index, size_in_bytes=piece.length, storage_data=(piece, total))
            for item, piece in pieces
        ]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage: dict[MetadataIndex, Piece] = {}
        objects: dict[str, ObjectSum] = {}
        for rank_results in results:
            for result in rank_results:
                piece, total = result.storage_data
                storage[result.index] = piece
                objects[piece.object] = total
        metadata.storage_data = storage
        buffer = io.BytesIO()
        torch.save(metadata, buffer)
        data = buffer.getbuffer()
        with self._store.writer(self._name + METADATA_SUFFIX) as target:
            target.write(data)
        objects[self._name + METADATA_SUFFIX] = checksum(data)
        self.objects = dict(sorted(objects.items()))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # only ever passed explicitly


# What the weights-only unpickler may build when reading DCP's metadata.
_METADATA_CLASSES: list[Any] = [
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    TensorProperties,
    Piece,
    _MEM_FORMAT_ENCODING,
    torch.Size,
    torch.memory_format,
    torch.layout,
]


def _verified(store: CheckpointStore, name: str, expected: ObjectSum | None, checkpoint: str) -> bytes:
    data = store.read(name)
    if expected is None:
        raise CheckpointError(f"checkpoint {checkpoint}: object {name} is not in its commit record")
    if len(data) != expected.size:
        raise CheckpointError(
            f"checkpoint {checkpoint} is truncated: {name} has {len(data)} of {expected.size} bytes"
        )
    found = checksum(data)
    if found.checksum != expected.checksum:
        raise CheckpointError(
            f"checkpoint {checkpoint} fails its checksum: {name} {CHECKSUM} {found.checksum} != "
            f"{expected.checksum}"
        )
    return data


def read_metadata(store: CheckpointStore, name: str, objects: Mapping[str, ObjectSum]) -> Metadata:
    """The verified DCP metadata of checkpoint `name`."""
    key = name + METADATA_SUFFIX
    data = _verified(store, key, objects.get(key), name)
    try:
        with torch.serialization.safe_globals(_METADATA_CLASSES):
            metadata = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        raise CheckpointError(f"checkpoint {name}: its metadata {key} cannot be read: {error}") from error
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"checkpoint {name}: {key} holds {type(metadata).__name__}, not DCP metadata")
    return metadata


class StoreReader(StorageReader):
    """DCP's storage reader for checkpoint `name`, whose record lists `objects`. Each object a rank needs is
    read whole and checked against the record before any of its bytes reach a tensor."""

    def __init__(
        self, store: CheckpointStore, name: str, objects: Mapping[str, ObjectSum], metadata: Metadata
    ) -> None:
        super().__init__()
        self._store = store
        self._name = name
        self._objects = objects
        self._metadata = metadata
        self._pieces: Mapping[MetadataIndex, Piece] = metadata.storage_data

    def reset(self, checkpoint_id: Any = None) -> None:
        return None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self._metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self._pieces = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_object: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            by_object.setdefault(self._pieces[item.storage_index].object, []).append(item)
        # One object at a time, checked whole before any of its bytes is used, then dropped: a rank holds
        # at most one object beside the state it fills. A corrupt object fails the load on every rank
        # (DCP gathers the failure); what earlier objects filled is overwritten by the next checkpoint tried.
        for key, items in sorted(by_object.items()):
            data = _verified(self._store, key, self._objects.get(key), self._name)
            for item in items:
                self._apply(data, item, planner)
            del data
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _apply(self, data: bytes, item: ReadItem, planner: LoadPlanner) -> None:
        piece = self._pieces[item.storage_index]
        raw = memoryview(data)[piece.offset : piece.offset + piece.length]
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(raw))
            return
        assert piece.dtype is not None and piece.shape is not None
        dtype = getattr(torch, piece.dtype.removeprefix("torch."))
        with warnings.catch_warnings():  # the bytes are read-only; they are only copied from
            warnings.simplefilter("ignore", UserWarning)
            flat = (
                torch.frombuffer(raw, dtype=torch.uint8)
                if piece.length
                else torch.empty(0, dtype=torch.uint8)
            )
        tensor = flat.view(dtype).reshape(piece.shape)
        tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise CheckpointError(
                f"checkpoint {self._name}: {item.dest_index.fqn} has shape {tuple(tensor.size())}; this "
                f"run's model expects {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(item, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor values with the weights-only unpickler."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class _ReusingSavePlanner(DefaultSavePlanner):
    """DCP's default save planner with its plan caching on, under `key`: when no rank's local plan changed
    since the last save under the same key, the ranks send the coordinator an empty plan instead of theirs,
    and the coordinator neither rebuilds nor validates the global plan; each rank writes by the final plan
    it kept. A checkpointer saves the same structure at every step, so only its first save plans in full.

    The cache is DCP's, per process and key. DCP compares plans by names, offsets and sizes, not dtypes, so
    a rank whose state's layout changed (dtypes included) drops its kept local plan and sends a new one,
    and the coordinator makes new metadata. Should the ranks' caches ever fall out of step (a rank reusing a
    plan the coordinator does not have), the coordinator refuses the save rather than write metadata that
    misses that rank's part, and `save_shards` forgets the key on every rank, so the next save plans afresh.
    """

    def __init__(self, key: str) -> None:
        super().__init__(enable_plan_caching=True)
        self._cached_plans_key = key
        self._layout: tuple[Any, ...] = ()

    def create_local_plan(self) -> SavePlan:
        # DCP builds the local plan (a DTensor's chunk and offsets, milliseconds for a model) only to find it
        # unchanged. The state's layout says as much for a fraction of that: the same entries, each of the
        # same kind, shape and dtype (a DTensor's placement is fixed for a checkpointer's life: the group is).
        self._layout = tuple(
            (fqn, type(value).__name__, tuple(value.shape), value.dtype, _local_shape(value))
            if isinstance(value, torch.Tensor)
            else (fqn, "bytes")
            for fqn, value in self.state_dict.items()
        )
        if (
            _LAYOUTS.get(self._cached_plans_key) == self._layout
            and self._cached_plans_key in SavePlanner._cached_final_save_plan
        ):
            return SavePlan([], usable=False)
        # A new layout: DCP's comparison, blind to dtypes, must not find the old local plan "unchanged".
        SavePlanner._cached_save_plan.pop(self._cached_plans_key, None)
        return super().create_local_plan()

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        finished = super().finish_plan(new_plan)
        _LAYOUTS[self._cached_plans_key] = self._layout  # the plan for this layout is now the cached one
        return finished

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        cached = self._cached_plans_key in SavePlanner._cached_all_plans
        if not cached and not all(plan.usable for plan in all_plans):
            raise CheckpointError(
                "the ranks' save plans are out of step (a rank reused a plan the coordinator does not have); "
                "this save fails and the next one plans afresh"
            )
        return super().create_global_plan(all_plans)


def _local_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor._local_tensor.shape) if isinstance(tensor, DTensor) else tuple(tensor.shape)


_LAYOUTS: dict[str, tuple[Any, ...]] = {}  # the state's layout each key's cached plans were made for

_PLAN_CACHES: tuple[dict[str, Any], ...] = (
    _LAYOUTS,
    SavePlanner._cached_save_plan,
    SavePlanner._cached_final_save_plan,
    SavePlanner._cached_all_plans,
    SavePlanner._cached_global_plan,
    SavePlanner._cached_metadata,
)


def forget_plans(prefix: str) -> None:
    """Drop every plan DCP keeps under a key starting with `prefix` (a checkpointer's, when it closes)."""
    for cache in _PLAN_CACHES:
        for key in [key for key in cache if key.startswith(prefix)]:
            del cache[key]


@dataclass(frozen=True)
class ShardGroup:
    """The ranks that write a sharded checkpoint together, and the process group of their collectives.

    The group is a gloo group of its own, made by every rank at start-up: a save's collectives run in each
    rank's background writer thread, and on training's group they could interleave with its all-reduces in
    a different order on different ranks (gloo and NCCL need one order). gloo also moves the small CPU
    objects a save exchanges (plans, results, the record) whatever device trains. None for one process."""

    rank: int
    world_size: int
    group: Any = None

    @classmethod
    def create(cls, rank: int, world_size: int) -> ShardGroup:
        group = dist.new_group(backend="gloo") if world_size > 1 else None
        return cls(rank, world_size, group)

    @property
    def coordinator(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def broadcast(self, value: Any) -> Any:
        """The coordinator's `value`, on every rank."""
        if not self.distributed:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=0, group=self.group)
        return holder[0]


@dataclass(frozen=True)
class ShardedMetadata:
    """A sharded checkpoint's verified DCP metadata: which tensors and values it holds, and where."""

    dcp: Metadata

    @classmethod
    def read(cls, store: CheckpointStore, name: str, objects: Mapping[str, ObjectSum]) -> ShardedMetadata:
        return cls(read_metadata(store, name, objects))

    def holds(self, prefix: str) -> bool:
        """Whether any entry's flattened name starts with `prefix` ("best." for the best weights)."""
        return any(key.startswith(prefix) for key in self.dcp.state_dict_metadata)


def object_sums(objects: Mapping[str, Mapping[str, Any]]) -> dict[str, ObjectSum]:
    """A record's `objects` as sums (a malformed entry is a `CheckpointError`)."""
    try:
        return {key: ObjectSum.from_dict(value) for key, value in objects.items()}
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"checkpoint record lists an object without its size and {CHECKSUM}: {error}"
        ) from None


def _first_failure(error: CheckpointException) -> BaseException:
    """The lowest failing rank's own exception (DCP gathers every rank's, wrapped with its traceback)."""
    failures = error.failures
    if not failures:
        return RuntimeError(str(error))
    failure = failures[min(failures)]
    return failure[0] if isinstance(failure, tuple) else failure


def save_shards(
    store: CheckpointStore,
    name: str,
    state: dict[str, Any],
    shards: ShardGroup,
    ready: Callable[[torch.Tensor], None] = lambda tensor: None,
    refusal: Callable[[], BaseException | None] = lambda: None,
    planned: Callable[[list[torch.Tensor]], None] = lambda tensors: None,
    plans: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Every rank together: write `state` (staged: host buffers and DTensors around them, `ready` when each
    is filled, once `planned(tensors)` has named what this rank writes) as checkpoint `name`'s shards and
    metadata. Returns, on the coordinator, every object written with its size and checksum ({} elsewhere);
    a failure on any rank (`refusal()`, if this rank brings one) raises that rank's error on every rank.
    `plans`, if given, keys the plans this save may reuse from this process's last save under it
    (`_ReusingSavePlanner`): one key per checkpointer."""
    writer = StoreWriter(store, name, ready, refusal, planned)
    planner = DefaultSavePlanner() if plans is None else _ReusingSavePlanner(plans)
    try:
        with warnings.catch_warnings():  # one process: DCP warns that it saves without a process group
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(
                state,
                storage_writer=writer,
                planner=planner,
                process_group=shards.group,
                no_dist=not shards.distributed,
            )
    except BaseException as error:
        if plans is not None:
            forget_plans(plans)  # every rank sees the failure: all of them plan the next save afresh
        if isinstance(error, CheckpointException):
            raise _first_failure(error) from None
        raise
    return {key: value.to_dict() for key, value in writer.objects.items()}


def load_shards(
    store: CheckpointStore,
    name: str,
    objects: Mapping[str, ObjectSum],
    metadata: ShardedMetadata,
    target: dict[str, Any],
    shards: ShardGroup | None,
) -> None:
    """Every rank together: fill `target` in place from checkpoint `name`, resharded to this world."""
    reader = StoreReader(store, name, objects, metadata.dcp)
    distributed = shards is not None and shards.distributed
    try:
        with warnings.catch_warnings():  # one process: DCP warns that it loads without a process group
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(
                target,
                storage_reader=reader,
                planner=SafeLoadPlanner(),
                process_group=shards.group if shards is not None else None,
                no_dist=not distributed,
            )
    except CheckpointException as error:
        raise CheckpointError(storage_failure(_first_failure(error), store.location)) from None
    except (RuntimeError, ValueError) as error:  # a state that does not fit this run's model
        raise CheckpointError(f"checkpoint {name} does not fit this run: {storage_failure(error)}") from error
