"""A new attempt names its checkpoints with a number no object in the store uses, readable or not, so a
location whose every checkpoint is corrupt still takes the new attempt's saves (issue 14, item 6)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from azure.storage.blob import ContainerClient
from helpers.training.small_run import NO_TRACKING, SMALL_RUN, STEPS_PER_EPOCH

from core.errors import CheckpointError
from training.checkpoint.blob_store import BlobCheckpointStore
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.open_store import CONNECTION_STRING_VARIABLE
from training.checkpoint.records import CheckpointMeta, checkpoint_name, committed_checkpoints, next_attempt
from training.checkpoint.store_protocol import CheckpointStore
from training.cli import main


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ([], 1),
        (["step-0000000010-a001.json", "step-0000000010-a001.pt"], 2),
        # gaps: only the highest number counts
        (["step-0000000010-a001.pt", "step-0000000090-a004.json", "step-0000000050-a002.pt"], 5),
        # data whose record never came, and a local store's temp file of a write killed midway
        (["step-0000000010-a001.json", "step-0000000020-a003.pt"], 4),
        ([".step-0000000020-a007.pt.tmp-0123abcd", "step-0000000010-a002.pt"], 8),
        (["step-0000000020-a1000.pt"], 1001),
        # foreign files, even ones that look almost like checkpoints, are not checkpoint names
        (["notes.txt", "step-0000000010-a009.bak", "mystep-0000000010-a009.pt", "step-10-a009.pt"], 1),
        (["step-0000000010-a009", ".step-0000000010-a009.pt.tmp-XYZ", "step-0000000010-a02.pt"], 1),
    ],
)
def test_next_attempt_is_one_past_every_attempt_any_checkpoint_object_is_named_with(names, expected):
    assert next_attempt(names) == expected


@dataclass
class DamageableStore:
    store: CheckpointStore
    damage: Callable[[str, Callable[[bytes], bytes]], None]  # rewrites an object behind the store's back


@pytest.fixture(params=["local", "blob"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DamageableStore]:
    if request.param == "local":
        yield _local(tmp_path / "ckpt")
        return
    container = request.getfixturevalue("azurite").new_container()
    yield _blob(container)
    container.delete_container()


def _local(root: Path) -> DamageableStore:
    def damage_file(name: str, change: Callable[[bytes], bytes]) -> None:
        (root / name).write_bytes(change((root / name).read_bytes()))

    return DamageableStore(LocalCheckpointStore(root), damage_file)


def _blob(container: ContainerClient) -> DamageableStore:
    def damage_blob(name: str, change: Callable[[bytes], bytes]) -> None:
        blob = container.get_blob_client(f"run/{name}")
        blob.upload_blob(change(blob.download_blob().readall()), overwrite=True)

    return DamageableStore(BlobCheckpointStore(container, "run"), damage_blob)


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 3]


def _flip_one_bit(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1 :]


def _meta(step: int, attempt: int) -> CheckpointMeta:
    return CheckpointMeta(step, 0, step * 8, "interval", attempt, "test", 1, "dv-test")


def _save(checkpointer: Checkpointer, step: int, attempt: int) -> None:
    checkpointer.save({"weights": torch.full((64,), float(step))}, _meta(step, attempt))
    checkpointer.wait_until_durable()


def test_a_store_of_only_corrupt_checkpoints_gets_a_new_attempt_whose_save_is_readable(target):
    writer = Checkpointer(target.store)
    _save(writer, 10, attempt=1)
    _save(writer, 20, attempt=1)
    # Closed so that the pruning queued behind its last save is done: run after `newest_valid` below had
    # found both corrupt, it would remove them, and their names would no longer be taken.
    writer.close()
    checkpointer = Checkpointer(target.store)
    for name, damage in zip(
        committed_checkpoints(target.store.names()), (_truncate, _flip_one_bit), strict=True
    ):
        target.damage(name + ".pt", damage)
    assert checkpointer.newest_valid() is None

    # What a fresh start would have done before: attempt 1 again, whose name at step 20 is taken. (A
    # checkpointer that found them corrupt prunes them before its next write, so a fresh one tries it.)
    earlier = Checkpointer(target.store)
    with pytest.raises(CheckpointError, match="already exists"):
        _save(earlier, 20, attempt=1)
    earlier.close()
    assert checkpointer.next_attempt() == 2
    _save(checkpointer, 20, attempt=2)
    loaded = checkpointer.newest_valid()
    assert loaded is not None and loaded.record.name == checkpoint_name(20, 2)
    assert torch.equal(loaded.state["weights"], torch.full((64,), 20.0))
    checkpointer.close()


def _train_one_epoch(data: Path, out: Path, checkpoints: str) -> int:
    locations = ["--data", str(data), "--out", str(out), "--checkpoints", checkpoints]
    return main(["train", *locations, *SMALL_RUN, "--epochs", "1", *NO_TRACKING, "--progress", "none"])


@pytest.mark.parametrize("where", ["local", "blob"])
def test_training_over_only_corrupt_checkpoints_starts_afresh_and_every_save_lands(
    where, prepared_data, tmp_path, request, monkeypatch
):
    if where == "local":
        spec, target = str(tmp_path / "ckpt"), _local(tmp_path / "ckpt")
    else:
        azurite = request.getfixturevalue("azurite")
        monkeypatch.setenv(CONNECTION_STRING_VARIABLE, azurite.connection_string)
        container = azurite.new_container()
        spec, target = f"{azurite.container_url(container.container_name)}/run", _blob(container)
    assert _train_one_epoch(prepared_data, tmp_path / "first", spec) == 0
    damaged = committed_checkpoints(target.store.names())
    assert damaged == [checkpoint_name(STEPS_PER_EPOCH, 1), checkpoint_name(40, 1)]
    for name, damage in zip(damaged, (_truncate, _flip_one_bit), strict=True):
        target.damage(name + ".pt", damage)

    assert _train_one_epoch(prepared_data, tmp_path / "second", spec) == 0
    metadata = json.loads((tmp_path / "second" / "metadata.json").read_text())
    assert [(entry["attempt"], entry["resumed_from"]) for entry in metadata["attempts"]] == [(2, None)]
    assert metadata["checkpoints"]["failed"] == 0
    assert metadata["checkpoints"]["last_saved"] == checkpoint_name(STEPS_PER_EPOCH, 2)
    loaded = Checkpointer(target.store).newest_valid()
    assert loaded is not None and loaded.record.name == checkpoint_name(STEPS_PER_EPOCH, 2)
    assert loaded.record.attempt == 2
