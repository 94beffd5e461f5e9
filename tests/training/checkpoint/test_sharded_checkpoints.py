"""The sharded checkpoint layout on its own, one process, on a real local folder and on Azurite: what a save
writes and its record lists, what a load checks before it fills a tensor, and the storage-fault rules of
the single-file layout (a full disk leaves nothing, a failed record takes its data with it, keep-two)."""

from __future__ import annotations

import io
import json
import logging
import os
import select
import signal
import zlib
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import cast

import pytest
import torch
from helpers.training.filling_disk import FillingStore
from helpers.training.gloo_ranks import run_on_ranks, start_on_ranks

from core.errors import CheckpointError
from training.checkpoint.checkpointer import Checkpointer, CheckpointMeta
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import LAYOUT_SHARDED, RECORD_SUFFIX, CheckpointRecord, committed_checkpoints
from training.checkpoint.sharded import CHECKSUM, PLAIN_CHECKSUM, ShardGroup
from training.checkpoint.store_protocol import CheckpointStore

ONE_PROCESS = ShardGroup(rank=0, world_size=1)


def _state(seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {
            "weight": torch.randn(64, 32, generator=generator),
            "half": torch.randn(8, 8, generator=generator).to(torch.bfloat16),
            "count": torch.tensor(seed, dtype=torch.int64),  # 0-dim
            "empty": torch.zeros(0, 4),
        },
        "run": b"progress \x00\xff not utf-8",
    }


def _target() -> dict:
    return {
        "model": {
            "weight": torch.zeros(64, 32),
            "half": torch.zeros(8, 8, dtype=torch.bfloat16),
            "count": torch.tensor(-1, dtype=torch.int64),
            "empty": torch.zeros(0, 4),
        },
        "run": b"",
    }


def _meta(step: int) -> CheckpointMeta:
    return CheckpointMeta(
        step=step, epoch=0, position=step, reason="interval", attempt=1, launch_id="l", world_size=1,
        data_version="dv-test",
    )  # fmt: skip


def _save(
    checkpointer: Checkpointer, step: int, seed: int = 0, saved: dict | None = None
) -> CheckpointRecord | None:
    checkpointer.save(_state(seed) if saved is None else saved, _meta(step))
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    assert result is not None
    checkpointer.wait_until_idle()  # and pruned
    return result.record


def _record(store: CheckpointStore, name: str) -> CheckpointRecord:
    return CheckpointRecord.from_bytes(store.read(name + RECORD_SUFFIX), name)


def test_a_save_writes_each_shard_and_the_metadata_then_a_record_listing_their_sizes_and_checksums(
    inner_store,
):
    store = inner_store
    checkpointer = Checkpointer(store, shards=ONE_PROCESS)
    record = _save(checkpointer, 10, seed=3)
    assert record is not None and record.layout == LAYOUT_SHARDED and record.checksum == CHECKSUM
    assert sorted(store.names()) == [
        "step-0000000010-a001.dcp", "step-0000000010-a001.json", "step-0000000010-a001.shard-00000",
    ]  # fmt: skip
    assert sorted(record.objects) == ["step-0000000010-a001.dcp", "step-0000000010-a001.shard-00000"]
    sizes = {name: len(store.read(name)) for name in record.objects}
    assert {name: entry["size"] for name, entry in record.objects.items()} == sizes
    assert record.size == sum(sizes.values()) and _record(store, record.name) == record
    # Raw tensor bytes back to back, no pickled copy of each tensor: the shard is exactly the tensors'
    # bytes and the one non-tensor value as torch.save writes it.
    pickled_run = io.BytesIO()
    torch.save(_state()["run"], pickled_run)
    tensor_bytes = sum(t.numel() * t.element_size() for t in _state()["model"].values())
    assert sizes["step-0000000010-a001.shard-00000"] == tensor_bytes + len(pickled_run.getvalue())

    target = _target()
    metadata = checkpointer.sharded_metadata(record)
    checkpointer.load_shards(record, metadata, target)
    for key, tensor in _state(seed=3)["model"].items():
        assert torch.equal(target["model"][key], tensor) and target["model"][key].dtype == tensor.dtype
    assert target["run"] == _state()["run"]
    assert not metadata.holds("best.")
    checkpointer.close()


def _flip_one_bit(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1 :]


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_flip_one_bit, f"fails its checksum: step-0000000020-a001.shard-00000 {CHECKSUM}"),
        (lambda d: d[:100], "is truncated"),
    ],
    ids=["bit-flipped", "truncated"],
)
def test_a_damaged_shard_is_refused_before_any_tensor_is_filled_and_the_previous_checkpoint_loads(
    tmp_path, damage, says
):
    store = LocalCheckpointStore(tmp_path / "ckpt")
    checkpointer = Checkpointer(store, shards=ONE_PROCESS)
    _save(checkpointer, 10, seed=1)
    newest = _save(checkpointer, 20, seed=2)
    shard = tmp_path / "ckpt" / "step-0000000020-a001.shard-00000"
    shard.write_bytes(damage(shard.read_bytes()))

    candidates = checkpointer.resume_candidates()  # rank 0 checks presence; each rank its reads' sums
    assert [each.name for each in candidates] == ["step-0000000020-a001", "step-0000000010-a001"]
    target = _target()
    with pytest.raises(CheckpointError, match=says):
        checkpointer.load_shards(newest, checkpointer.sharded_metadata(newest), target)
    assert torch.equal(target["model"]["weight"], _target()["model"]["weight"])  # untouched
    checkpointer.load_shards(candidates[1], checkpointer.sharded_metadata(candidates[1]), target)
    assert torch.equal(target["model"]["weight"], _state(seed=1)["model"]["weight"])
    checkpointer.close()


def test_a_checkpoint_missing_a_shard_is_skipped_with_a_warning(tmp_path, caplog):
    store = LocalCheckpointStore(tmp_path / "ckpt")
    checkpointer = Checkpointer(store, shards=ONE_PROCESS)
    _save(checkpointer, 10)
    _save(checkpointer, 20)
    (tmp_path / "ckpt" / "step-0000000020-a001.shard-00000").unlink()
    with caplog.at_level(logging.WARNING):
        candidates = checkpointer.resume_candidates()
    assert [each.name for each in candidates] == ["step-0000000010-a001"]
    assert "step-0000000020-a001 is incomplete: step-0000000020-a001.shard-00000 missing" in caplog.text
    checkpointer.close()


@pytest.mark.parametrize(
    "fails",
    [lambda name: True, lambda name: name.endswith(".dcp")],
    ids=["every-object", "the-metadata-written-beside-the-shards"],
)
def test_a_sharded_save_on_a_full_disk_fails_with_the_reason_and_leaves_nothing(inner_store, fails):
    """The second save is like the first, so the coordinator writes its metadata while the shards are
    written: that write failing alone fails the save too, and nothing of it is left."""
    store = inner_store
    filling = FillingStore(store, fails=fails)
    checkpointer = Checkpointer(filling, shards=ONE_PROCESS)
    assert _save(checkpointer, 10) is not None
    before = sorted(store.names())
    filling.fill_up()
    checkpointer.save(_state(), _meta(20))
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    assert result is not None and result.record is None
    assert result.failure == f"no space left on device on {store.location}"
    assert sorted(store.names()) == before
    assert (checkpointer.stats.failed, checkpointer.stats.failed_since_last_saved) == (1, 1)
    checkpointer.close()


def test_shards_whose_record_failed_are_removed(inner_store):
    store = inner_store
    filling = FillingStore(store, fails=lambda name: name.endswith(RECORD_SUFFIX))
    filling.fill_up()
    checkpointer = Checkpointer(filling, shards=ONE_PROCESS)
    checkpointer.save(_state(), _meta(10))
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    assert result is not None and result.record is None and "no space left on device" in result.failure
    assert store.names() == []  # the shard and the metadata went with the record that never came
    checkpointer.close()


def test_keep_two_prunes_every_object_of_an_older_sharded_checkpoint(inner_store):
    store = inner_store
    checkpointer = Checkpointer(store, shards=ONE_PROCESS)
    for step in (10, 20, 30):
        _save(checkpointer, step)
    assert sorted({name.split(".")[0] for name in store.names()}) == [
        "step-0000000020-a001", "step-0000000030-a001",
    ]  # fmt: skip
    assert len(store.names()) == 6
    checkpointer.close()


def test_a_save_whose_plan_fails_still_finishes_its_copy_and_writes_nothing(inner_store):
    """The copy waits for the ranks' write plan; a plan that cannot be made (two entries that flatten to
    one name) must still let it end, or training would wait for it forever before its next step."""
    store = inner_store
    checkpointer = Checkpointer(store, shards=ONE_PROCESS)
    clashing = {"model.weight": torch.ones(4), "model": {"weight": torch.zeros(4)}}
    checkpointer.save(clashing, _meta(10))
    checkpointer.wait_until_staged()
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    assert result is not None and result.record is None and not result.refused
    assert "duplicated flatten key model.weight" in result.failure
    assert store.names() == []
    assert _save(checkpointer, 20) is not None  # the next save commits
    checkpointer.close()


def test_a_record_listing_another_checkpoints_object_is_unreadable():
    record = CheckpointRecord(
        name="step-0000000010-a001", step=10, epoch=0, position=0, reason="interval", attempt=1,
        launch_id="l", world_size=2, data_version="dv", sha256="", size=1, created_at="now",
        layout=LAYOUT_SHARDED, checksum=CHECKSUM,
        objects={"step-0000000020-a001.shard-00000": {"size": 1, CHECKSUM: "00000000"}},
    )  # fmt: skip
    with pytest.raises(CheckpointError, match="listing its own objects"):
        CheckpointRecord.from_bytes(record.to_bytes(), record.name)


# -- the snapshot's own check (issue 23) ---------------------------------------------------------------


def _refuse_nan(staged) -> str | None:
    """The trainer's check in small: every floating tensor of the model that this rank staged is finite."""
    floating = [tensor for tensor in staged["model"].values() if tensor.is_floating_point()]
    finite = all(bool(torch.isfinite(tensor).all()) for tensor in floating)
    return None if finite else "the weights it left are not finite"


def test_a_refused_sharded_snapshot_writes_nothing_and_the_next_save_is_whole(inner_store):
    store = inner_store
    checkpointer = Checkpointer(store, shards=ONE_PROCESS)
    poisoned = _state(1)
    poisoned["model"]["weight"][0, 0] = float("inf")
    checkpointer.save(poisoned, _meta(10), verify=_refuse_nan)
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    assert result is not None and result.refused and result.failure == "the weights it left are not finite"
    assert store.names() == []
    checkpointer.save(_state(2), _meta(20), verify=_refuse_nan)
    assert checkpointer.wait_until_durable().record.name == "step-0000000020-a001"
    assert (checkpointer.stats.refused, checkpointer.stats.failed) == (1, 0)
    checkpointer.close()


def _one_rank_refuses(rank: int, world_size: int, folder: str) -> None:
    """Rank 1's shard holds a NaN, rank 0's does not: rank 0 writes its shard, and still no record comes,
    every rank hears the refusal, and nothing is left; then a save with finite shards commits. (Each rank
    checks what it writes: a tensor only it holds is its own to write.)"""
    store = LocalCheckpointStore(Path(folder))
    checkpointer = Checkpointer(store, shards=ShardGroup.create(rank, world_size))
    poisoned = _state(rank)
    poisoned["model"][f"rank{rank}"] = torch.ones(4)
    if rank == 1:
        poisoned["model"]["rank1"][1] = float("nan")
    checkpointer.save(poisoned, _meta(10), verify=_refuse_nan)
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    assert result is not None and result.record is None and result.refused, result
    assert result.failure == "the weights it left are not finite"
    checkpointer.wait_until_idle()
    torch.distributed.barrier()
    assert store.names() == []  # rank 0's shard went with the save
    checkpointer.save(_state(rank), _meta(20), verify=_refuse_nan)
    record = checkpointer.wait_until_durable().record
    assert record is not None and record.name == "step-0000000020-a001"
    assert sorted(record.objects) == [
        "step-0000000020-a001.dcp", "step-0000000020-a001.shard-00000", "step-0000000020-a001.shard-00001",
    ]  # fmt: skip
    checkpointer.close()


def test_one_ranks_refusal_refuses_the_sharded_save_on_every_rank_and_leaves_nothing(tmp_path):
    run_on_ranks(2, tmp_path, _one_rank_refuses, str(tmp_path / "ckpt"))


def _one_rank_cannot_stage(rank: int, world_size: int, folder: str) -> None:
    """Rank 1's staging buffers cannot be allocated (a broadcast view of 4 bytes whose copy would take 256
    TiB): it takes part with nothing to write, and the save fails on every rank with its error, not as a
    refusal; rank 0's shard goes with it. The next save, of a state that stages, commits."""
    store = LocalCheckpointStore(Path(folder))
    checkpointer = Checkpointer(store, shards=ShardGroup.create(rank, world_size))
    state = _state(rank)
    if rank == 1:
        state["model"]["huge"] = torch.zeros(1).expand(2**46)
    checkpointer.save(state, _meta(10))
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    assert result is not None and result.record is None and not result.refused, result
    assert "can't allocate memory" in result.failure, result.failure
    checkpointer.wait_until_idle()
    torch.distributed.barrier()
    assert store.names() == []
    checkpointer.save(_state(rank), _meta(20))
    record = checkpointer.wait_until_durable().record
    assert record is not None and record.name == "step-0000000020-a001"
    checkpointer.close()


def test_a_rank_that_cannot_stage_fails_the_sharded_save_on_every_rank_and_leaves_nothing(tmp_path):
    run_on_ranks(2, tmp_path, _one_rank_cannot_stage, str(tmp_path / "ckpt"))


def _replicas_stage_their_share(rank: int, world_size: int, folder: str) -> None:
    """Both ranks hold the same replica (DDP's): each stages, and checks, only the tensors it writes, and
    between them every tensor once; the checkpoint loads back whole."""
    store = LocalCheckpointStore(Path(folder))
    checkpointer = Checkpointer(store, shards=ShardGroup.create(rank, world_size))
    replica = _state(7)
    replica["model"].update({f"layer{i}": torch.full((16, 16), float(i)) for i in range(6)})
    seen: list[str] = []

    def check(staged) -> str | None:
        seen.extend(staged["model"])
        return None

    checkpointer.save(replica, _meta(10), verify=check)
    record = checkpointer.wait_until_durable().record
    assert record is not None
    every: list[list[str]] = [[] for _ in range(world_size)]
    torch.distributed.all_gather_object(every, sorted(seen))
    mine, theirs = set(every[0]), set(every[1])
    holding_bytes = {key for key, value in replica["model"].items() if value.numel()}
    assert mine and theirs and not (mine & theirs - {"empty"}), every  # a share each, none twice
    assert (mine | theirs) >= holding_bytes  # every tensor with bytes staged by one of them
    target = {"model": {key: torch.zeros_like(value) for key, value in replica["model"].items()}, "run": b""}
    checkpointer.load_shards(record, checkpointer.sharded_metadata(record), target)
    for key, value in replica["model"].items():
        assert torch.equal(target["model"][key], value), key
    checkpointer.close()


def test_replicated_ranks_each_stage_only_the_share_they_write(tmp_path):
    run_on_ranks(2, tmp_path, _replicas_stage_their_share, str(tmp_path / "ckpt"))


# -- a rank lost at the end of a save (issue 41) -------------------------------------------------------


class _LosesRank1AtRecord:
    """Rank 0's store: just before it writes the commit record `record`, rank 1 is SIGKILLed and its end
    awaited, as losing rank 1's node after the ranks' last gather and before the coordinator's broadcast."""

    def __init__(self, inner: CheckpointStore, rank_1_pid: int, record: str) -> None:
        self._inner = inner
        self._pid = rank_1_pid
        self._record = record

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    @property
    def location(self) -> str:
        return self._inner.location

    @contextmanager
    def writer(self, name: str):
        if name == self._record:
            ended = os.pidfd_open(self._pid)
            os.kill(self._pid, signal.SIGKILL)
            select.select([ended], [], [])  # readable once the process has exited, its sockets closed
            os.close(ended)
        with self._inner.writer(name) as target:
            yield target


def _rank_1_lost_as_rank_0_commits(rank: int, world_size: int, folder: str, outcome: str) -> None:
    """Two saves by every rank; rank 1 dies as rank 0 writes the second's record. Rank 0's save is then
    committed, and rank 0 must say so (not "not saved"); it writes what it saw to `outcome`."""
    pids: list[int | None] = [None] * world_size
    torch.distributed.all_gather_object(pids, os.getpid())
    store: CheckpointStore = LocalCheckpointStore(Path(folder))
    if rank == 0:
        store = _LosesRank1AtRecord(store, cast(int, pids[1]), "step-0000000020-a001" + RECORD_SUFFIX)
    checkpointer = Checkpointer(store, shards=ShardGroup.create(rank, world_size))
    checkpointer.save(_state(rank), _meta(10))
    assert checkpointer.wait_until_durable().record is not None
    checkpointer.save(_state(rank), _meta(20))
    result = checkpointer.wait_until_durable(raise_on_failure=False)  # rank 1 is killed in it
    assert result is not None
    checkpointer.close()
    seen = {
        "record": result.record.name if result.record is not None else None,
        "failure": result.failure,
        "saved": checkpointer.stats.saved,
        "failed": checkpointer.stats.failed,
        "records": committed_checkpoints(store.names()),
    }
    Path(outcome).write_text(json.dumps(seen))
    os._exit(0)  # the group has lost rank 1: nothing to end together


def test_a_save_committed_as_a_rank_dies_is_reported_saved_not_lost(tmp_path):
    outcome = tmp_path / "rank-0.json"
    ranks = start_on_ranks(2, tmp_path, _rank_1_lost_as_rank_0_commits, str(tmp_path / "ckpt"), str(outcome))
    try:
        for process in ranks:
            process.join()
    finally:
        for process in ranks:
            process.kill()
    assert [process.exitcode for process in ranks] == [0, -signal.SIGKILL]
    seen = json.loads(outcome.read_text())
    assert seen["records"] == ["step-0000000020-a001", "step-0000000010-a001"]  # committed: a restart's
    assert (seen["record"], seen["failure"]) == ("step-0000000020-a001", None)
    assert (seen["saved"], seen["failed"]) == (2, 0)


# -- an object is its checkpoint's (issue 41) ------------------------------------------------------------


def test_a_shard_copied_from_another_checkpoint_with_its_sum_fails_and_the_checkpoint_before_loads(
    inner_store,
):
    """Step 20's shard replaced by step 10's, and step 10's size and checksum copied into step 20's record
    beside it: the checksum covers the object's name, so the shard fails it (before, it loaded step 10's
    weights as step 20's). Step 10's checkpoint still loads."""
    store = inner_store
    checkpointer = Checkpointer(store, shards=ONE_PROCESS)
    older = _save(checkpointer, 10, seed=1)
    newest = _save(checkpointer, 20, seed=2)
    assert older is not None and newest is not None
    shard, its_original = "step-0000000020-a001.shard-00000", "step-0000000010-a001.shard-00000"
    store.delete(shard)
    with store.writer(shard) as target:
        target.write(store.read(its_original))
    forged = CheckpointRecord(
        **{**asdict(newest), "objects": {**newest.objects, shard: older.objects[its_original]}}
    )
    store.delete(newest.record_object)
    with store.writer(newest.record_object) as target:
        target.write(forged.to_bytes())

    record = _record(store, newest.name)
    target = _target()
    with pytest.raises(
        CheckpointError, match=f"fails its checksum: {shard} {CHECKSUM} .* another checkpoint's"
    ):
        checkpointer.load_shards(record, checkpointer.sharded_metadata(record), target)
    checkpointer.load_shards(older, checkpointer.sharded_metadata(older), target)
    assert torch.equal(target["model"]["weight"], _state(seed=1)["model"]["weight"])
    checkpointer.close()


def test_a_record_of_plain_crc32_sums_from_before_the_names_still_verifies(tmp_path):
    """Checkpoints written before the checksum covered the object's name name `crc32` in their record and
    list each object's CRC-32 of its bytes alone: they load, and a damaged one still fails."""
    store = LocalCheckpointStore(tmp_path / "ckpt")
    checkpointer = Checkpointer(store, shards=ONE_PROCESS)
    written = _save(checkpointer, 10, seed=4)
    assert written is not None
    plain = {
        name: {"size": entry["size"], PLAIN_CHECKSUM: f"{zlib.crc32(store.read(name)):08x}"}
        for name, entry in written.objects.items()
    }
    old = CheckpointRecord(**{**asdict(written), "checksum": PLAIN_CHECKSUM, "objects": plain})
    (tmp_path / "ckpt" / written.record_object).write_bytes(old.to_bytes())

    record = _record(store, written.name)
    target = _target()
    checkpointer.load_shards(record, checkpointer.sharded_metadata(record), target)
    assert torch.equal(target["model"]["weight"], _state(seed=4)["model"]["weight"])
    shard = tmp_path / "ckpt" / "step-0000000010-a001.shard-00000"
    shard.write_bytes(_flip_one_bit(shard.read_bytes()))
    with pytest.raises(CheckpointError, match=f"fails its checksum: {shard.name} {PLAIN_CHECKSUM} "):
        checkpointer.load_shards(record, checkpointer.sharded_metadata(record), _target())
    checkpointer.close()
