"""The checkpointer on both stores: asynchronous saves, verified loads, corruption, pruning, failures."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from core.errors import CheckpointError
from training.checkpoint.blob_store import BlobCheckpointStore
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import (
    CheckpointMeta,
    checkpoint_name,
    committed_checkpoints,
    objects_to_prune,
)
from training.checkpoint.store_protocol import CheckpointStore


@dataclass
class StoreUnderTest:
    store: CheckpointStore
    tamper: Callable[[str, Callable[[bytes], bytes]], None]  # rewrites an object behind the store's back


@pytest.fixture(params=["local", "blob"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreUnderTest]:
    if request.param == "local":
        root = tmp_path / "ckpt"

        def tamper_file(name: str, change: Callable[[bytes], bytes]) -> None:
            path = root / name
            path.write_bytes(change(path.read_bytes()))

        yield StoreUnderTest(LocalCheckpointStore(root), tamper_file)
        return
    container = request.getfixturevalue("azurite").new_container()

    def tamper_blob(name: str, change: Callable[[bytes], bytes]) -> None:
        blob = container.get_blob_client(f"run/{name}")
        blob.upload_blob(change(blob.download_blob().readall()), overwrite=True)

    yield StoreUnderTest(BlobCheckpointStore(container, "run"), tamper_blob)
    container.delete_container()


def _meta(step: int, reason: str = "interval") -> CheckpointMeta:
    return CheckpointMeta(
        step=step,
        epoch=0,
        position=step * 8,
        reason=reason,
        attempt=1,
        launch_id="test",
        world_size=1,
        data_version="dv-test",
    )


def _state(value: float) -> dict:
    return {"model": {"weight": torch.full((64, 64), value)}, "progress": {"step": int(value)}, "tag": "x"}


def _save(checkpointer: Checkpointer, step: int) -> None:
    checkpointer.save(_state(float(step)), _meta(step))
    checkpointer.wait_until_durable()
    checkpointer.wait_until_idle()  # and pruned


def test_saved_state_loads_back_equal(target: StoreUnderTest) -> None:
    checkpointer = Checkpointer(target.store)
    _save(checkpointer, 3)
    loaded = checkpointer.newest_valid()
    assert loaded is not None
    assert loaded.record.step == 3 and loaded.record.position == 24
    assert torch.equal(loaded.state["model"]["weight"], torch.full((64, 64), 3.0))
    assert loaded.state["progress"] == {"step": 3} and loaded.state["tag"] == "x"
    assert checkpointer.stats.saved == 1 and checkpointer.stats.bytes_written == loaded.record.size


def test_snapshot_is_isolated_from_updates_after_staging(target: StoreUnderTest) -> None:
    checkpointer = Checkpointer(target.store)
    live = _state(1.0)
    checkpointer.save(live, _meta(1))
    checkpointer.wait_until_staged()
    live["model"]["weight"].add_(100.0)  # the optimizer step that follows the fence
    checkpointer.wait_until_durable()
    loaded = checkpointer.newest_valid()
    assert torch.equal(loaded.state["model"]["weight"], torch.full((64, 64), 1.0))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda data: data[: len(data) // 2], "truncated"),
        (lambda data: data[:100] + bytes([data[100] ^ 0x01]) + data[101:], "fails its checksum"),
    ],
    ids=["truncated", "bit-flipped"],
)
def test_damaged_newest_checkpoint_is_skipped_for_the_previous(
    target: StoreUnderTest, damage, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    checkpointer = Checkpointer(target.store)
    _save(checkpointer, 1)
    _save(checkpointer, 2)
    newest = committed_checkpoints(target.store.names())[0]
    target.tamper(newest + ".pt", damage)
    with caplog.at_level(logging.WARNING):
        loaded = checkpointer.newest_valid()
    assert loaded is not None and loaded.record.step == 1
    assert any(newest in message and expected in message for message in caplog.messages)


def test_only_the_newest_checkpoints_are_kept(target: StoreUnderTest) -> None:
    checkpointer = Checkpointer(target.store, keep_last=2)
    for step in (1, 2, 3, 4):
        _save(checkpointer, step)
        kept = committed_checkpoints(target.store.names())
        assert [int(name[5:15]) for name in kept] == list(range(step, max(0, step - 2), -1))
    assert len(target.store.names()) == 4  # two checkpoints, each data + record


# -- a junk commit record (issue 20, item 13) ---------------------------------------------------------

JUNK = checkpoint_name(9_999_999_999, 1)


def _put(target: StoreUnderTest, name: str, data: bytes) -> None:
    with target.store.writer(name) as sink:
        sink.write(data)


@pytest.mark.parametrize("junk", [b"", b"{not json", b'{"name": "other"}'], ids=["empty", "torn", "wrong"])
def test_an_unreadable_record_is_not_kept_and_is_removed(target: StoreUnderTest, junk: bytes, caplog) -> None:
    _put(target, JUNK + ".json", junk)  # newer than any real checkpoint: it would be first of the kept
    _put(target, JUNK + ".pt", b"no checkpoint")
    checkpointer = Checkpointer(target.store, keep_last=2)

    with caplog.at_level(logging.WARNING):
        for step in (1, 2, 3):
            _save(checkpointer, step)

    assert committed_checkpoints(target.store.names()) == [checkpoint_name(3, 1), checkpoint_name(2, 1)]
    assert not any(name.startswith(JUNK) for name in target.store.names())
    assert any(JUNK in message and "record is unreadable" in message for message in caplog.messages)
    # Both kept checkpoints are real: the newest loads, and so does the one before it.
    assert checkpointer.newest_valid().record.step == 3
    assert checkpointer.load(checkpoint_name(2, 1)).record.step == 2


def test_pruning_never_counts_an_unreadable_record_among_the_kept():
    one, two, junk = (checkpoint_name(step, 1) for step in (1, 2, 9))
    names = [f"{name}{suffix}" for name in (one, two, junk) for suffix in (".json", ".pt")]

    # Records before data, so that no record is ever left naming data that is gone.
    assert objects_to_prune(names, keep_last=2, unreadable=[junk]) == [f"{junk}.json", f"{junk}.pt"]
    assert objects_to_prune(names, keep_last=1, unreadable=[junk]) == [
        f"{one}.json",
        f"{junk}.json",
        f"{one}.pt",
        f"{junk}.pt",
    ]


def test_keeping_fewer_than_two_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="keep at least 2"):
        Checkpointer(LocalCheckpointStore(tmp_path), keep_last=1)


def test_a_failed_write_commits_nothing_and_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    checkpointer = Checkpointer(LocalCheckpointStore(root))
    _save(checkpointer, 1)
    shutil.rmtree(root)
    root.write_text("the storage went away")  # every write into the folder now fails for real
    checkpointer.save(_state(2.0), _meta(2))
    with pytest.raises(CheckpointError, match="checkpoint at step 2 failed"):
        checkpointer.wait_until_durable()
    assert checkpointer.stats.failed == 1 and checkpointer.stats.saved == 1


# -- after the handover: pruning, and the snapshot's own check (issue 23) ------------------------------


class HeldDeletes:
    """A store whose deletes wait until the test lets them go: what happens while pruning is under way."""

    def __init__(self, inner: CheckpointStore) -> None:
        self._inner = inner
        self.released = threading.Event()
        self.deleting = threading.Event()

    def delete(self, name: str) -> None:
        self.deleting.set()
        assert self.released.wait(timeout=60), "the test never released the deletes"
        self._inner.delete(name)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def test_a_save_is_handed_over_before_the_old_checkpoints_are_pruned_and_the_next_write_waits_for_them(
    tmp_path: Path,
) -> None:
    store = HeldDeletes(LocalCheckpointStore(tmp_path / "ckpt"))
    checkpointer = Checkpointer(store, keep_last=2)  # type: ignore[arg-type]
    _save(checkpointer, 1)
    _save(checkpointer, 2)
    checkpointer.save(_state(3.0), _meta(3))
    result = checkpointer.wait_until_durable()  # while the deletes of step 1 are held
    assert result is not None and result.record is not None and result.record.step == 3
    assert store.deleting.wait(timeout=60)  # pruning has begun, and cannot end
    assert committed_checkpoints(store.names())[-1] == checkpoint_name(1, 1)  # not yet pruned
    checkpointer.save(_state(4.0), _meta(4))  # its write queues behind the pruning
    assert not checkpointer.wait_until_written(timeout=0.2)
    store.released.set()
    assert checkpointer.wait_until_durable().record.step == 4
    checkpointer.wait_until_idle()
    assert committed_checkpoints(store.names()) == [checkpoint_name(4, 1), checkpoint_name(3, 1)]
    checkpointer.close()


def _refuse_non_finite(staged) -> str | None:
    weight = staged["model"]["weight"]
    return None if bool(torch.isfinite(weight).all()) else "the weights it left are not finite"


def test_a_snapshot_its_check_refuses_is_not_written_and_is_not_a_failed_save(target: StoreUnderTest) -> None:
    checkpointer = Checkpointer(target.store, keep_last=2)
    checkpointer.save(_state(1.0), _meta(1), verify=_refuse_non_finite)
    assert checkpointer.wait_until_durable().record is not None
    poisoned = _state(2.0)
    poisoned["model"]["weight"][3, 5] = float("nan")
    checkpointer.save(poisoned, _meta(2), verify=_refuse_non_finite)
    result = checkpointer.wait_until_durable(raise_on_failure=False)
    checkpointer.wait_until_idle()

    assert result is not None and result.record is None and result.refused
    assert result.failure == "the weights it left are not finite"
    assert committed_checkpoints(target.store.names()) == [checkpoint_name(1, 1)]
    assert len(target.store.names()) == 2  # nothing of step 2, not even a partial file
    stats = checkpointer.stats
    assert (stats.saved, stats.refused, stats.failed, stats.failed_since_last_saved) == (1, 1, 0, 0)
    assert checkpointer.newest_valid().record.step == 1
    checkpointer.close()
