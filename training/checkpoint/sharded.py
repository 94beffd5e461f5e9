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
- `<name>.dcp`: DCP's metadata (which chunk of which tensor lies where), written by the coordinator (while
  the shards are written, when it is the last save's, as it is at most steps: `SavePlans`);
- `<name>.json`: the commit record, written last by the checkpointer; it lists every object above with its
  size and checksum (training/checkpoint/records.py).

The checksum is CRC-32, the one zlib computes, by ISA-L (the `isal` package: the same values at 8-25 GB/s
on one core here, against zlib's 2-3 GB/s and sha256's 1.2 GB/s), so hashing costs a few milliseconds per
shard and never holds the save below the disk's speed. It is taken over the object's name, then its bytes
(`crc32-named`): an object copied under another checkpoint's name fails it, even with its own sum copied
into that checkpoint's record. It guards against corruption in storage, truncation and objects mixed up
between checkpoints, not against an adversary who can write the checkpoint location: that one could
replace the record too. The record names the algorithm; records of plain `crc32` (before the name was in
it) still verify by it.

Loading never unpickles arbitrary objects: the metadata and every non-tensor value are read with torch's
weights-only unpickler, as the single-file layout reads its checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import logging
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
from training.checkpoint.store_protocol import CheckpointStore, storage_failure

log = logging.getLogger(__name__)

CHECKSUM = "crc32-named"  # CRC-32 of the object's name (UTF-8), then its bytes
PLAIN_CHECKSUM = "crc32"  # CRC-32 of the bytes alone: records written before the name was in it
CHECKSUMS = (CHECKSUM, PLAIN_CHECKSUM)
METADATA_SUFFIX = ".dcp"
SHARD_SUFFIX = ".shard-"


def shard_object(name: str, index: int) -> str:
    return f"{name}{SHARD_SUFFIX}{index:05d}"


@dataclass(frozen=True)
class ObjectSum:
    """One object of a sharded checkpoint as its record lists it."""

    size: int
    checksum: str  # hex digits of `algorithm`
    algorithm: str = CHECKSUM

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, self.algorithm: self.checksum}

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any], algorithm: str = CHECKSUM) -> ObjectSum:
        return cls(size=int(fields["size"]), checksum=str(fields[algorithm]), algorithm=algorithm)


def _name_crc(name: str) -> int:
    """Where an object's `CHECKSUM` starts: the CRC-32 of its name."""
    return crc32(name.encode())


@dataclass(frozen=True)
class Piece:
    """Where one write item's bytes lie: in the checkpoint's shard number `shard`, at `offset`, `length`
    bytes; a tensor's dtype and shape, so that its raw bytes become a tensor again (None for a pickled
    non-tensor value). No checkpoint's name is in it: a save that lays its items out as the last one did
    has the same metadata, byte for byte, and reuses it."""

    shard: int
    offset: int
    length: int
    dtype: str | None
    shape: tuple[int, ...] | None


class _Checksummed:
    """Writes object `name` to `target`, counting and checksumming what passes (a file's `OSError` passes
    through: the checkpointer reports its reason)."""

    def __init__(self, target: BinaryIO, name: str) -> None:
        self._target = target
        self.crc = _name_crc(name)
        self.size = 0

    def write(self, data: memoryview) -> None:
        self.crc = crc32(data, self.crc)
        self.size += len(data)
        self._target.write(data)

    def result(self) -> ObjectSum:
        return ObjectSum(self.size, f"{self.crc:08x}")


def checksum(data: bytes | memoryview, name: str, algorithm: str = CHECKSUM) -> ObjectSum:
    """Object `name`'s sum, holding `data`, by `algorithm`."""
    start = _name_crc(name) if algorithm == CHECKSUM else 0
    return ObjectSum(len(data), f"{crc32(data, start):08x}", algorithm)


@dataclass(frozen=True)
class _MetadataBytes:
    """A checkpoint's serialised DCP metadata, and where it says each item lies. The same bytes serve
    every save of the same layout; each checkpoint's metadata object has its own name, and so its own sum."""

    pieces: dict[MetadataIndex, Piece]
    data: bytes

    def sum_as(self, name: str) -> ObjectSum:
        return checksum(self.data, name)


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy when it is a contiguous CPU tensor (a staged buffer is)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(cast(Any, flat.view(torch.uint8).numpy())) if flat.numel() else memoryview(b"")


class StoreWriter(StorageWriter):
    """DCP's storage writer for checkpoint `name` in `store`; every rank has one, the coordinator (rank 0)
    writes the metadata. Once the metadata is written, the coordinator's `objects` lists what was written.
    `save_shards` also drives it without DCP's `save`, by a kept plan.

    The state may still be being staged as the writer plans and writes: `planned(tensors)` is called once
    the plan is known, with the tensors this rank will write, in order (the stager copies those from then
    on), and `ready(tensor)` blocks until a tensor's bytes are there.
    `refusal()`, asked once this rank's shard is written, is this rank's reason not to save (None to save),
    raised there, so that the save fails on every rank (a rank that left early would leave the others in
    their collectives)."""

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
        self._sums: dict[str, ObjectSum] = {}
        self.objects: dict[str, ObjectSum] = {}
        self.metadata: _MetadataBytes | None = None

    @property
    def location(self) -> str:
        return self._store.location

    def reset(self, checkpoint_id: Any = None) -> None:
        self._sums, self.objects, self.metadata = {}, {}, None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        # Each rank's shard is its own object, named by its rank in the group (its place in the global
        # plan): the plan is reused from save to save, and names no checkpoint.
        self._rank = int(kwargs.get("rank", 0))

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        # Tensors first, then the pickled values, whose lengths change from save to save: so that the
        # tensors' offsets, most of the metadata, stay the same.
        items = [item for item in plan.items if item.type != WriteItemType.BYTE_IO]
        items += [item for item in plan.items if item.type == WriteItemType.BYTE_IO]
        tensors = (planner.resolve_data(item) for item in items if item.type != WriteItemType.BYTE_IO)
        self._planned([tensor for tensor in tensors if isinstance(tensor, torch.Tensor)])
        results: list[WriteResult] = []
        if items:
            results = self._write_shard(items, planner)
        refused = self._refusal()
        if refused is not None:
            raise refused
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _write_shard(self, items: list[WriteItem], planner: SavePlanner) -> list[WriteResult]:
        pieces: list[tuple[WriteItem, Piece]] = []
        shard = self._rank
        with self._store.writer(shard_object(self._name, shard)) as target:
            out = _Checksummed(target, shard_object(self._name, shard))
            for item in items:
                data = planner.resolve_data(item)
                offset = out.size
                if item.type == WriteItemType.BYTE_IO:
                    assert isinstance(data, io.BytesIO)
                    out.write(data.getbuffer())
                    piece = Piece(shard, offset, out.size - offset, None, None)
                else:
                    assert isinstance(data, torch.Tensor)
                    self._ready(data)
                    out.write(_tensor_bytes(data))
                    piece = Piece(shard, offset, out.size - offset, str(data.dtype), tuple(data.shape))
                pieces.append((item, piece))
            total = out.result()
        # Every piece carries its object's sum too, so that the coordinator learns it from the results.
        return [
            WriteResult(index=item.index, size_in_bytes=piece.length, storage_data=(piece, total))
            for item, piece in pieces
        ]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator, once every rank's shard is durable: the metadata, with where each item lies."""
        pieces = self.pieces(results)
        metadata.storage_data = pieces
        buffer = io.BytesIO()
        torch.save(metadata, buffer)
        written = _MetadataBytes(pieces, buffer.getvalue())
        self.write_metadata(written.data)
        self.wrote_metadata(written)

    def pieces(self, results: list[list[WriteResult]]) -> dict[MetadataIndex, Piece]:
        """Where each item of every rank's `results` lies; every shard's sum is noted for `objects`."""
        pieces: dict[MetadataIndex, Piece] = {}
        for rank_results in results:
            for result in rank_results:
                piece, total = result.storage_data
                pieces[result.index] = piece
                self._sums[shard_object(self._name, piece.shard)] = total
        return pieces

    def write_metadata(self, data: bytes) -> None:
        with self._store.writer(self.metadata_object) as target:
            target.write(data)

    def remove_metadata(self) -> None:
        self._store.delete(self.metadata_object)

    def wrote_metadata(self, metadata: _MetadataBytes) -> None:
        """The metadata object, written, holds `metadata`: `objects` lists it with the shards `pieces`
        noted."""
        self.metadata = metadata
        metadata_sum = metadata.sum_as(self.metadata_object)
        self.objects = dict(sorted({**self._sums, self.metadata_object: metadata_sum}.items()))

    @property
    def metadata_object(self) -> str:
        return self._name + METADATA_SUFFIX

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
    found = checksum(data, name, expected.algorithm)
    if found.checksum != expected.checksum:
        raise CheckpointError(
            f"checkpoint {checkpoint} fails its checksum: {name} {expected.algorithm} {found.checksum} != "
            f"{expected.checksum} (damaged, or another checkpoint's object)"
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
            piece = self._pieces[item.storage_index]
            by_object.setdefault(shard_object(self._name, piece.shard), []).append(item)
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


def _layout(flat_state: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a save's plan depends on, of a flattened state: its entries, each one's kind, and a tensor's
    shape, dtype and local shape (a DTensor's placement is fixed for a checkpointer's life: its group is)."""
    return tuple(
        (fqn, type(value).__name__, tuple(value.shape), value.dtype, _local_shape(value))
        if isinstance(value, torch.Tensor)
        else (fqn, "bytes")
        for fqn, value in flat_state.items()
    )


def _local_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor._local_tensor.shape) if isinstance(tensor, DTensor) else tuple(tensor.shape)


@dataclass(frozen=True)
class _KeptPlan:
    layout: tuple[Any, ...]
    local: SavePlan  # what this rank writes
    metadata: Metadata | None  # the coordinator's: which chunk of which tensor every rank writes
    written: _MetadataBytes | None  # the coordinator's: the metadata the last save wrote


class SavePlans:
    """The plan of a checkpointer's last sharded save, which its next saves reuse while the state keeps its
    layout: one per checkpointer, on every rank.

    Planning is a round of collectives: the coordinator gathers every rank's plan, gives each replicated
    tensor to one rank, checks the whole and sends each rank its part. A checkpointer saves a state of the
    same layout at every step, so each rank keeps its part and the coordinator the metadata, and a later
    save whose state has the layout its kept plan was made for writes by it at once (`save_shards`), once
    every rank has said it has one. A rank whose layout changed says so in that vote, and the ranks plan
    again together.

    Why not plan at every save with DCP's own `save`: its round of collectives, and the metadata written
    after the shards rather than beside them, cost 15-60 ms of a 90-160 ms save on 2 busy cores, which held
    DDP's save path at 0.69 of a raw parallel write (FSDP's 0.82) against 0.82 (0.93) reusing the plan
    (bench/sharded_save.py, layout `sharded-replanned`: medians of 3 runs, 2026-12-07). DCP's own plan
    cache (`DefaultSavePlanner(enable_plan_caching=True)`) keeps the collectives and measured below reuse.
    """

    def __init__(self) -> None:
        self._kept: _KeptPlan | None = None
        self._beside: concurrent.futures.ThreadPoolExecutor | None = None

    def beside(self, work: Callable[..., None], *args: Any) -> concurrent.futures.Future[None]:
        """`work(*args)` in a thread beside the save's (the coordinator's metadata, written meanwhile). The
        thread is kept: starting one per save costs milliseconds when the cores are busy."""
        if self._beside is None:
            self._beside = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-metadata")
        return self._beside.submit(work, *args)

    def close(self) -> None:
        """Forget the plan and stop the thread (after what it was given)."""
        self._kept = None
        if self._beside is not None:
            self._beside.shutdown(wait=True)

    def kept_for(self, layout: tuple[Any, ...]) -> _KeptPlan | None:
        kept = self._kept
        return kept if kept is not None and kept.layout == layout else None

    def keep(self, plan: _KeptPlan) -> None:
        self._kept = plan

    def forget(self) -> None:
        self._kept = None


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

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's `value`, in rank order, on the coordinator (None on the others)."""
        if not self.distributed:
            return [value]
        values: list[Any] | None = [None] * self.world_size if self.coordinator else None
        dist.gather_object(value, values, group=self.group, group_dst=0)
        return values

    def every_rank(self, value: bool) -> bool:
        """Whether `value` is true on every rank: one small all-reduce, every rank's answer the same."""
        if not self.distributed:
            return value
        flag = torch.tensor([1 if value else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

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


def object_sums(objects: Mapping[str, Mapping[str, Any]], algorithm: str = CHECKSUM) -> dict[str, ObjectSum]:
    """A record's `objects` as sums by its `algorithm` (a malformed entry, or an algorithm of neither
    `CHECKSUMS`, is a `CheckpointError`)."""
    if algorithm not in CHECKSUMS:
        raise CheckpointError(
            f"checkpoint record names checksum {algorithm!r}; expected one of {', '.join(CHECKSUMS)}"
        )
    try:
        return {key: ObjectSum.from_dict(value, algorithm) for key, value in objects.items()}
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"checkpoint record lists an object without its size and {algorithm}: {error}"
        ) from None


def _first_failure(error: CheckpointException) -> BaseException:
    """The lowest failing rank's own exception (DCP gathers every rank's, wrapped with its traceback)."""
    failures = error.failures
    if not failures:
        return RuntimeError(str(error))
    failure = failures[min(failures)]
    return failure[0] if isinstance(failure, tuple) else failure


@dataclass(frozen=True)
class _Failure:
    """A failed rank's error in a form every rank can rebuild: its type when it is one of ours (a refusal
    stays a refusal everywhere), and its one line, secrets masked."""

    kind: type[CheckpointError]
    line: str

    @classmethod
    def of(cls, error: BaseException, location: str) -> _Failure:
        kind = type(error) if isinstance(error, CheckpointError) else CheckpointError
        return cls(kind, storage_failure(error, location))

    def error(self) -> CheckpointError:
        try:
            return self.kind(self.line)
        except TypeError:  # a subclass that takes other arguments
            return CheckpointError(self.line)


@dataclass(frozen=True)
class _Report:
    """What a rank tells the coordinator at the end of a save by kept plans: what it wrote (None if the
    ranks did not write by them), or why it failed."""

    results: list[WriteResult] | None = None
    failure: _Failure | None = None


@dataclass(frozen=True)
class _Replan:
    """The coordinator's word when some rank had no plan for its state's layout: plan together, then save."""


@dataclass(frozen=True)
class Commit:
    """The coordinator's part in ending a sharded save. `record(objects)` runs once every object is durable
    (each with its size and checksum) and writes the commit record; what it returns reaches every rank as
    the save's result. `abandon(error)` runs when a rank failed, before any rank hears of it (so before
    another save can start), to remove what the save wrote."""

    record: Callable[[dict[str, dict[str, Any]]], Any]
    abandon: Callable[[BaseException], None]


def save_shards(
    store: CheckpointStore,
    name: str,
    state: dict[str, Any],
    shards: ShardGroup,
    commit: Commit,
    *,
    ready: Callable[[torch.Tensor], None] = lambda tensor: None,
    refusal: Callable[[], BaseException | None] = lambda: None,
    planned: Callable[[list[torch.Tensor]], None] = lambda tensors: None,
    plans: SavePlans | None = None,
    unstaged: BaseException | None = None,
) -> Any:
    """Every rank together: write `state` (staged: host buffers and DTensors around them, `ready` when each
    is filled, once `planned(tensors)` has named what this rank writes) as checkpoint `name`'s shards and
    metadata; the coordinator then commits (`commit`). Returns `commit.record`'s result on every rank. A
    failure on any rank (`refusal()`, if this rank brings one) raises on every rank: its own error on the
    rank that failed, the same kind of error with the same line on the others. A rank that could not stage
    its state at all (`unstaged`, with `state` empty) still takes part, and fails the save with that error.

    With `plans` (one per checkpointer), a save whose state keeps the layout of the last one skips planning:
    the ranks first agree, in one small all-reduce, that every one of them has a plan for its state's
    layout, then each writes by its kept plan, and one gather tells the coordinator every shard is durable.
    If any rank's layout changed (or it has no plan), nobody writes by a kept plan: the ranks learn it from
    that same all-reduce and plan together (DCP's `save`), keeping the new plan. A failed save leaves no
    plan kept, so the next one plans afresh."""
    writer = StoreWriter(store, name, ready, refusal, planned)
    if plans is not None:
        outcome = _save_by_kept_plans(writer, state, shards, commit, plans, unstaged)
        if not isinstance(outcome, _Replan):
            return outcome
    return _save_planned(writer, state, shards, commit, plans)


def _save_by_kept_plans(
    writer: StoreWriter,
    state: dict[str, Any],
    shards: ShardGroup,
    commit: Commit,
    plans: SavePlans,
    unstaged: BaseException | None,
) -> Any:
    error, kept, ahead, results = None, None, None, None
    try:  # nothing may leave before the vote and the gather: the other ranks would wait in them forever
        if unstaged is not None:
            raise unstaged
        planner = DefaultSavePlanner()
        planner.set_up_planner(state, None, shards.coordinator)
        kept = plans.kept_for(_layout(planner.state_dict))
    except BaseException as caught:
        error = caught
    # A kept plan is every rank's part of one plan: it holds only while every rank's state keeps the layout
    # it was made for. One rank's layout may change alone (the best validated weights appear in rank 0's
    # state only), so the ranks write by their kept plans only if all of them have one, and else plan
    # together: decided before anyone writes, so that no rank has written by a plan the others dropped.
    reusing = shards.every_rank(error is None and kept is not None)
    if reusing:
        assert kept is not None
        try:
            if kept.written is not None:  # the coordinator: this save's metadata, very likely the last one's
                ahead = plans.beside(writer.write_metadata, kept.written.data)
            writer.set_up_storage_writer(shards.coordinator, rank=shards.rank)
            results = writer.write_data(kept.local, planner).value()
        except BaseException as caught:
            error = caught
    failure = _Failure.of(error, writer.location) if error is not None else None
    reports = shards.gather(_Report(results, failure))
    outcome: Any = None
    if reports is not None:  # the coordinator
        ahead_error = ahead.exception() if ahead is not None else None  # written (or failed) before any end
        failures = [each.failure for each in reports if each.failure is not None]
        error = error or ahead_error
        if error is not None or failures:
            outcome = _abandoned(error or failures[0].error(), writer, commit)
        elif not reusing:
            outcome = _Replan()
        else:
            assert kept is not None
            outcome = _committed(writer, kept, [each.results or [] for each in reports], ahead, commit, plans)
    return _agreed(_told(shards, outcome), error, plans)


def _save_planned(
    writer: StoreWriter, state: dict[str, Any], shards: ShardGroup, commit: Commit, plans: SavePlans | None
) -> Any:
    planner = DefaultSavePlanner()
    error: BaseException | None = None
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
    except BaseException as caught:  # DCP raises every rank's failures on every rank
        error = _first_failure(caught) if isinstance(caught, CheckpointException) else caught
    outcome: Any = None
    if shards.coordinator:
        if error is not None:
            outcome = _abandoned(error, writer, commit)
        else:
            outcome = _record(writer.objects, writer, commit)
    agreed = _agreed(_told(shards, outcome), error, plans)
    if plans is not None:  # DCP's planner holds this rank's final plan, and the coordinator's the metadata
        metadata = planner.metadata if shards.coordinator else None
        plans.keep(_KeptPlan(_layout(planner.state_dict), planner.plan, metadata, writer.metadata))
    return agreed


def _committed(
    writer: StoreWriter,
    kept: _KeptPlan,
    results: list[list[WriteResult]],
    ahead: concurrent.futures.Future[None] | None,
    commit: Commit,
    plans: SavePlans,
) -> Any:
    """The coordinator, once every rank's shard is durable by the kept plans: the metadata (the one written
    ahead of time, if every item lies where it did in the last save; otherwise new), then the record."""
    try:
        pieces = writer.pieces(results)
        if ahead is not None and kept.written is not None and kept.written.pieces == pieces:
            writer.wrote_metadata(kept.written)
        else:
            if ahead is not None:  # a pickled value's length changed: the metadata written ahead is not
                writer.remove_metadata()  # this save's (no record names it yet), so it makes way for it
            assert kept.metadata is not None
            writer.finish(kept.metadata, results)
            plans.keep(dataclasses.replace(kept, written=writer.metadata))
    except BaseException as error:
        return _abandoned(error, writer, commit)
    return _record(writer.objects, writer, commit)


def _record(objects: Mapping[str, ObjectSum], writer: StoreWriter, commit: Commit) -> Any:
    try:
        return commit.record({key: value.to_dict() for key, value in objects.items()})
    except BaseException as error:
        return _abandoned(error, writer, commit)


def _abandoned(error: BaseException, writer: StoreWriter, commit: Commit) -> _Failure:
    commit.abandon(error)
    return _Failure.of(error, writer.location)


def _told(shards: ShardGroup, outcome: Any) -> Any:
    """The coordinator's `outcome`, on every rank. A rank that died after the gather (the node lost, a
    kill) cannot hear it; the coordinator's save is then still what its commit made it: a record written is
    a checkpoint that a restart resumes from, and is never reported as not saved."""
    try:
        return shards.broadcast(outcome)
    except BaseException as error:
        if not shards.coordinator or outcome is None or isinstance(outcome, (_Failure, _Replan)):
            raise
        log.warning(
            "checkpoint %s is committed, but not every rank could be told so: %s",
            getattr(outcome, "name", "written"),
            storage_failure(error),
        )
        return outcome


def _agreed(outcome: Any, error: BaseException | None, plans: SavePlans | None) -> Any:
    """This rank's end of a save whose outcome every rank now has: the commit's result, or the failure
    raised (this rank's own error, if it had one). A failed save leaves no plan kept."""
    if isinstance(outcome, _Failure):
        if plans is not None:
            plans.forget()
        if error is not None:
            raise error
        raise outcome.error()
    return outcome


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
