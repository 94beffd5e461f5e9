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
  every shard is durable;
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
    non-tensor value)."""

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


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy when it is a contiguous CPU tensor (a staged buffer is)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(cast(Any, flat.view(torch.uint8).numpy())) if flat.numel() else memoryview(b"")


class StoreWriter(StorageWriter):
    """DCP's storage writer for checkpoint `name` in `store`; every rank has one, the coordinator (rank 0)
    writes the metadata. Once the metadata is written, the coordinator's `objects` lists what was written.

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
        self.objects: dict[str, ObjectSum] = {}

    @property
    def location(self) -> str:
        return self._store.location

    def reset(self, checkpoint_id: Any = None) -> None:
        self.objects = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        # Each rank's shard is its own object, named by its rank in the group: no two ranks write one object.
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
            results = self._write_shard(plan.items, planner)
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
        """The coordinator, once every rank's shard is durable: the metadata, with where each item lies;
        `objects` then lists it and every shard, each with its sum."""
        pieces: dict[MetadataIndex, Piece] = {}
        sums: dict[str, ObjectSum] = {}
        for rank_results in results:
            for result in rank_results:
                piece, total = result.storage_data
                pieces[result.index] = piece
                sums[shard_object(self._name, piece.shard)] = total
        metadata.storage_data = pieces
        buffer = io.BytesIO()
        torch.save(metadata, buffer)
        data = buffer.getvalue()
        with self._store.writer(self.metadata_object) as target:
            target.write(data)
        sums[self.metadata_object] = checksum(data, self.metadata_object)
        self.objects = dict(sorted(sums.items()))

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
    unstaged: BaseException | None = None,
) -> Any:
    """Every rank together: write `state` (staged: host buffers and DTensors around them, `ready` when each
    is filled, once `planned(tensors)` has named what this rank writes) as checkpoint `name`'s shards and
    metadata with DCP's `save`, which plans who writes what; the coordinator then commits (`commit`).
    Returns `commit.record`'s result on every rank. A failure on any rank (`refusal()`, if this rank brings
    one) raises on every rank: its own error on the rank that failed, the same kind of error with the same
    line on the others. A rank that could not stage its state at all (`unstaged`, with `state` empty) still
    takes part, and fails the save with that error."""

    def refused() -> BaseException | None:
        return unstaged if unstaged is not None else refusal()

    writer = StoreWriter(store, name, ready, refused, planned)
    error: BaseException | None = None
    try:
        with warnings.catch_warnings():  # one process: DCP warns that it saves without a process group
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(
                state,
                storage_writer=writer,
                planner=DefaultSavePlanner(),
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
    return _agreed(_told(shards, outcome), error)


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
        if not shards.coordinator or outcome is None or isinstance(outcome, _Failure):
            raise
        log.warning(
            "checkpoint %s is committed, but not every rank could be told so: %s",
            getattr(outcome, "name", "written"),
            storage_failure(error),
        )
        return outcome


def _agreed(outcome: Any, error: BaseException | None) -> Any:
    """This rank's end of a save whose outcome every rank now has: the commit's result, or the failure
    raised (this rank's own error, if it had one)."""
    if isinstance(outcome, _Failure):
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
