from dataclasses import asdict

import pytest

from core.errors import CheckpointError
from training.checkpoint.records import (
    CheckpointMeta,
    CheckpointRecord,
    checkpoint_name,
    committed_checkpoints,
    objects_to_prune,
)


def _objects(*names, record=True):
    return [f"{name}.pt" for name in names] + ([f"{name}.json" for name in names] if record else [])


def test_committed_checkpoints_are_newest_first_by_step_then_attempt():
    arrival_order = ((10, 1), (30, 1), (30, 2), (20, 1))
    names = _objects(*(checkpoint_name(step, attempt) for step, attempt in arrival_order))
    assert committed_checkpoints(names) == [
        checkpoint_name(30, 2),
        checkpoint_name(30, 1),
        checkpoint_name(20, 1),
        checkpoint_name(10, 1),
    ]


def test_a_checkpoint_without_its_record_never_committed():
    names = _objects(checkpoint_name(10, 1)) + _objects(checkpoint_name(20, 1), record=False)
    assert committed_checkpoints(names) == [checkpoint_name(10, 1)]


def test_foreign_objects_are_ignored():
    assert committed_checkpoints(["notes.json", "step-12.json", "latest.json"]) == []


def test_pruning_keeps_the_newest_and_removes_records_before_data_and_orphans():
    old, middle, new = checkpoint_name(10, 1), checkpoint_name(20, 1), checkpoint_name(30, 1)
    orphan = checkpoint_name(25, 1)
    names = [*_objects(old, middle, new), f"{orphan}.pt"]
    doomed = objects_to_prune(names, keep_last=2)
    assert doomed == [f"{old}.json", f"{old}.pt", f"{orphan}.pt"]


def test_pruning_spares_a_later_save_of_the_same_attempt_that_another_rank_is_writing():
    """In the sharded layout rank 1 may publish the next save's shard while rank 0 prunes after the last
    one: that shard is no leftover. An uncommitted save of another attempt, or an earlier one, is."""
    old, middle, written = checkpoint_name(10, 2), checkpoint_name(20, 2), checkpoint_name(30, 2)
    in_flight, dead_attempt, earlier = checkpoint_name(40, 2), checkpoint_name(50, 1), checkpoint_name(25, 2)
    names = [
        *_objects(old, middle, written),
        f"{in_flight}.shard-00001",
        f"{dead_attempt}.dcp",
        f"{earlier}.pt",
    ]
    doomed = objects_to_prune(names, keep_last=2, written=written)
    assert doomed == [f"{old}.json", f"{old}.pt", f"{earlier}.pt", f"{dead_attempt}.dcp"]
    assert f"{in_flight}.shard-00001" in objects_to_prune(names, keep_last=2)  # without `written`: a leftover


def test_pruning_with_fewer_checkpoints_than_kept_removes_nothing():
    assert objects_to_prune(_objects(checkpoint_name(10, 1)), keep_last=2) == []


def _record(**overrides):
    fields = dict(
        name=checkpoint_name(5, 1),
        step=5,
        epoch=0,
        position=40,
        reason="interval",
        attempt=1,
        launch_id="abc",
        world_size=2,
        data_version="dv-1",
        sha256="0" * 64,
        size=10,
        created_at="2026-11-29T00:00:00Z",
    )
    return CheckpointRecord(**{**fields, **overrides})


# A record exactly as the checkpointer wrote it before `CheckpointMeta` became the record's base class.
EXISTING_RECORD = b"""{
  "attempt": 2,
  "checksum": "crc32-named",
  "created_at": "2026-12-01T10:00:00.000+00:00",
  "data_version": "dv-7",
  "epoch": 3,
  "format": "retrain-checkpoint/1",
  "launch_id": "launch-1",
  "layout": "sharded",
  "name": "step-0000000066-a002",
  "objects": {
    "step-0000000066-a002.dcp": {
      "crc32-named": "0a0b0c0d",
      "size": 100
    },
    "step-0000000066-a002.shard-00000": {
      "crc32-named": "01020304",
      "size": 200
    }
  },
  "position": 512,
  "reason": "preempted",
  "sha256": "",
  "size": 300,
  "step": 66,
  "trajectory": {
    "epochs": 5,
    "seed": 0
  },
  "world_size": 2
}"""


def test_an_existing_record_reads_with_its_meta_and_is_written_back_byte_for_byte():
    record = CheckpointRecord.from_bytes(EXISTING_RECORD, "step-0000000066-a002")
    meta = CheckpointMeta(66, 3, 512, "preempted", 2, "launch-1", 2, "dv-7", {"seed": 0, "epochs": 5})
    assert CheckpointMeta(**{key: getattr(record, key) for key in asdict(meta)}) == meta
    assert (record.size, record.layout, sorted(record.objects)) == (
        300, "sharded", ["step-0000000066-a002.dcp", "step-0000000066-a002.shard-00000"],
    )  # fmt: skip
    assert record.to_bytes() == EXISTING_RECORD


def test_record_round_trips_and_refuses_a_record_of_another_checkpoint():
    record = _record()
    assert CheckpointRecord.from_bytes(record.to_bytes(), record.name) == record
    with pytest.raises(CheckpointError, match="describes"):
        CheckpointRecord.from_bytes(record.to_bytes(), checkpoint_name(6, 1))
    with pytest.raises(CheckpointError, match="unreadable"):
        CheckpointRecord.from_bytes(b"{not json", record.name)
