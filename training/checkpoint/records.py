"""Checkpoint naming, commit records, and the pure rules for resuming and pruning.

A checkpoint is its data objects and, written last, a small commit record (`<name>.json`) that lists them.
In the single-file layout the data is one object (`<name>.pt`, written by rank 0), and the record holds its
size and sha256. In the sharded layout (training/checkpoint/sharded.py) every rank writes its own shard
(`<name>.shard-RRRRR`), the coordinator DCP's metadata (`<name>.dcp`), and the record lists each of them
with its size and checksum. A checkpoint without its record never committed and is ignored; one whose data
no longer matches its record is corrupt and skipped. Names carry the step and the attempt, so a step
re-done after a restart gets a new name: nothing is ever overwritten in place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from core.errors import CheckpointError

CHECKPOINT_FORMAT = "retrain-checkpoint/1"
DATA_SUFFIX = ".pt"
RECORD_SUFFIX = ".json"
LAYOUT_SINGLE = "single"  # rank 0 writes one file
LAYOUT_SHARDED = "sharded"  # every rank writes its shard (training/checkpoint/sharded.py)
LAYOUTS = (LAYOUT_SINGLE, LAYOUT_SHARDED)
_NAME = re.compile(r"step-(\d{10})-a(\d{3,})")
# A checkpoint's data objects: the single file, or a shard, or the sharded layout's DCP metadata.
_DATA_OBJECT = re.compile(r"(step-\d{10}-a\d{3,})(?:\.pt|\.dcp|\.shard-\d{5})")
# Every object a save of that name may leave: its data or record, published or as a local store's hidden
# temp file (`.<object>.tmp-<hex>`) of a write that never completed.
_ANY_OBJECT = re.compile(r"\.?step-\d{10}-a(\d{3,})(?:\.pt|\.json|\.dcp|\.shard-\d{5})(?:\.tmp-[0-9a-f]+)?")

REASON_INTERVAL = "interval"
REASON_PREEMPTED = "preempted"
REASON_FINAL = "final"


def checkpoint_name(step: int, attempt: int) -> str:
    return f"step-{step:010d}-a{attempt:03d}"


def _order_key(name: str) -> tuple[int, int] | None:
    match = _NAME.fullmatch(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class CheckpointMeta:
    """Where training stands at the checkpoint, and why it is taken: what the trainer gives a save."""

    step: int
    epoch: int
    position: int
    reason: str
    attempt: int
    launch_id: str
    world_size: int
    data_version: str
    trajectory: dict[str, Any] = field(default_factory=dict)  # the options that decide the run's course


# kw_only: the fields a record adds follow the meta's, one of which has a default. The record is written as
# flat JSON (`to_bytes`), so records of before the meta was its own class read as they always did.
@dataclass(frozen=True, kw_only=True)
class CheckpointRecord(CheckpointMeta):
    """What a checkpoint is, written after its data is durable: the save's meta, then what was written."""

    name: str
    sha256: str
    size: int
    created_at: str
    format: str = CHECKPOINT_FORMAT
    # The sharded layout: every data object with its size and checksum (`sha256` is then empty, `size`
    # their total). A record from before layouts existed is a single file's.
    layout: str = LAYOUT_SINGLE
    checksum: str = "sha256"
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def data_object(self) -> str:
        return self.name + DATA_SUFFIX

    @property
    def data_objects(self) -> list[str]:
        """Every data object the checkpoint consists of."""
        return sorted(self.objects) if self.layout == LAYOUT_SHARDED else [self.data_object]

    @property
    def record_object(self) -> str:
        return self.name + RECORD_SUFFIX

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, expected_name: str) -> CheckpointRecord:
        try:
            fields = json.loads(data)
            record = cls(**fields)
        except (ValueError, TypeError) as error:
            raise CheckpointError(
                f"checkpoint record {expected_name}{RECORD_SUFFIX} is unreadable: {error}"
            ) from error
        if record.format != CHECKPOINT_FORMAT or record.name != expected_name:
            raise CheckpointError(
                f"checkpoint record {expected_name}{RECORD_SUFFIX} describes {record.name!r} in format "
                f"{record.format!r}; expected {expected_name!r} in {CHECKPOINT_FORMAT!r}"
            )
        foreign = [key for key in record.objects if data_stem(key) != expected_name]
        if (
            record.layout not in LAYOUTS
            or foreign
            or (record.layout == LAYOUT_SHARDED and not record.objects)
        ):
            raise CheckpointError(
                f"checkpoint record {expected_name}{RECORD_SUFFIX} has layout {record.layout!r} with objects "
                f"{sorted(record.objects)}; expected one of {', '.join(LAYOUTS)}, a sharded one listing its "
                "own objects"
            )
        return record


def data_stem(object_name: str) -> str | None:
    """The checkpoint a data object belongs to (`step-…-a001` for `step-…-a001.shard-00001`), else None."""
    match = _DATA_OBJECT.fullmatch(object_name)
    return match.group(1) if match else None


def committed_checkpoints(object_names: Iterable[str]) -> list[str]:
    """Names of checkpoints whose commit record exists, newest first (by step, then attempt)."""
    names = {name.removesuffix(RECORD_SUFFIX) for name in object_names if name.endswith(RECORD_SUFFIX)}
    ordered = [(key, name) for name in names if (key := _order_key(name)) is not None]
    return [name for _, name in sorted(ordered, reverse=True)]


def next_attempt(object_names: Iterable[str]) -> int:
    """The attempt number a new attempt names its checkpoints with: one past every attempt seen in the names.

    Every name counts, readable or not: a corrupt or uncommitted `step-…-a001.pt` still occupies its name,
    and objects are never overwritten, so reusing attempt 1 would make that step's save fail. Names of
    other files are ignored.
    """
    seen = [int(match.group(1)) for name in object_names if (match := _ANY_OBJECT.fullmatch(name))]
    return max(seen, default=0) + 1


def uncommitted_data(object_names: Iterable[str]) -> list[str]:
    """Data objects whose commit record is missing: saves that published their data and then failed, or
    died, before their record. Nothing resumes from them, so removing them only gives their space back
    (when no save is in flight: a save publishes its data before its record)."""
    names = list(object_names)
    committed = {name.removesuffix(RECORD_SUFFIX) for name in names if name.endswith(RECORD_SUFFIX)}
    return sorted(name for name in names if (stem := data_stem(name)) is not None and stem not in committed)


def objects_to_prune(
    object_names: Iterable[str], keep_last: int, unreadable: Iterable[str] = (), written: str | None = None
) -> list[str]:
    """Objects that may go once the newest checkpoint (`written`, if given) is durable, records before their
    data.

    Keeps the `keep_last` newest committed checkpoints, not counting those in `unreadable` (checkpoints
    whose commit record does not parse): a junk record kept as one of two would leave one real
    checkpoint, so it goes, with its data. Records are written atomically and appear only once complete,
    so an unreadable one is no write in progress. Data objects without a record are leftovers of saves that
    never committed, except those of a later save of `written`'s attempt: in the sharded layout the other
    ranks may already be writing the next save's shards while the coordinator prunes.
    """
    names = list(object_names)
    junk = set(unreadable)
    committed = [name for name in committed_checkpoints(names) if name not in junk]
    kept = set(committed[:keep_last])
    present = set(names)
    doomed_records = [name + RECORD_SUFFIX for name in committed[keep_last:]]
    doomed_records += sorted(name + RECORD_SUFFIX for name in junk if name + RECORD_SUFFIX in present)
    doomed_data = [
        name
        for name in names
        if (stem := data_stem(name)) is not None
        and stem not in kept
        and not (stem + RECORD_SUFFIX not in present and _later_save(stem, written))
    ]
    return doomed_records + sorted(doomed_data)


def _later_save(name: str, written: str | None) -> bool:
    """Whether checkpoint `name` is a later save of the attempt that wrote `written`: maybe in flight."""
    if written is None:
        return False
    mine, theirs = _order_key(name), _order_key(written)
    return mine is not None and theirs is not None and mine[1] == theirs[1] and mine[0] > theirs[0]
