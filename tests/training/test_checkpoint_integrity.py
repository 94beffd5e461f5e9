"""A damaged newest checkpoint is detected on restart and the previous one is used; Blob works end to end."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import is_checkpoint, is_step, kill_process_tree, read_metadata, resumed_event

from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import committed_checkpoints
from training.checkpoint.stores import CONNECTION_STRING_VARIABLE
from training.preemption import PREEMPTED_EXIT_CODE


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 3]


def _flip_one_bit(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1 :]


@pytest.mark.parametrize("damage", [_truncate, _flip_one_bit], ids=["truncated", "bit-flipped"])
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning_and_the_previous_used(
    start_training, folders, damage
):
    process = start_training()
    process.wait_for(is_checkpoint(20))
    kill_process_tree(process)
    newest, previous = committed_checkpoints(LocalCheckpointStore(Path(folders.checkpoints)).names())[:2]
    data_file = Path(folders.checkpoints) / f"{newest}.pt"
    data_file.write_bytes(damage(data_file.read_bytes()))

    restart = start_training(extra=("--epochs", "1"))  # which checkpoint it resumes is decided at start
    assert restart.finish() == 0
    assert resumed_event(restart)["checkpoint"] == previous
    log_lines = (folders.logs / "attempt-2.log").read_text().splitlines()
    warnings = [line for line in log_lines if "skipping" in line]
    assert len(warnings) == 1 and newest in warnings[0]
    assert "truncated" in warnings[0] if damage is _truncate else "fails its checksum" in warnings[0]


def test_training_checkpoints_to_blob_storage_and_resumes_from_it(
    azurite, uninterrupted_run, start_training, folders
):
    container = azurite.new_container()
    folders.checkpoints = f"{azurite.blob_endpoint}/{container.container_name}/runs/small"
    credentials = {CONNECTION_STRING_VARIABLE: azurite.connection_string}

    process = start_training(env=credentials)
    process.wait_for(is_step(30))
    process.send_signal(signal.SIGTERM)
    assert process.finish() == PREEMPTED_EXIT_CODE
    blobs = [blob.name for blob in container.list_blobs(name_starts_with="runs/small/")]
    assert any(name.endswith(".json") for name in blobs) and any(name.endswith(".pt") for name in blobs)

    restart = start_training(env=credentials)
    assert restart.finish() == 0
    assert resumed_event(restart)["step"] >= 30
    metadata = read_metadata(folders.out)
    assert metadata["weights_sha256"] == uninterrupted_run["weights_sha256"]
    assert metadata["checkpoints"]["location"].startswith("http://127.0.0.1")
    assert azurite.connection_string not in (folders.logs / "attempt-2.log").read_text()
