"""What a killed or damaged run leaves behind is detected on restart: a damaged newest checkpoint is skipped
for the previous one, a half-finished save is ignored and cleared. Blob Storage works end to end."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from helpers.training.run_outputs import newest_record, read_metadata
from helpers.training.small_run import train_arguments
from helpers.training.training_process import is_checkpoint, is_step, kill_process_tree, resumed_event
from helpers.training.warm_training import WarmStarts

from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.open_store import CONNECTION_STRING_VARIABLE
from training.checkpoint.records import committed_checkpoints
from training.engine.preemption import PREEMPTED_EXIT_CODE


@pytest.fixture(scope="module")
def killed_run(
    prepared_data: Path, tmp_path_factory: pytest.TempPathFactory, warm_starts: WarmStarts
) -> Path:
    """The checkpoints of a single-process run SIGKILLed after its checkpoint at step 20 (read-only: each
    test damages its own copy). Whether the damage is noticed does not depend on the number of processes."""
    root = tmp_path_factory.mktemp("killed-run")
    process = warm_starts.training(
        [*train_arguments(prepared_data, root / "out", root / "checkpoints", nproc=1), "--no-mlflow"],
        stderr=(root / "stderr.log").open("w"),
    )
    process.wait_for(is_checkpoint(20))
    kill_process_tree(process)
    return root / "checkpoints"


@pytest.fixture
def killed_copy(killed_run: Path, folders) -> Path:
    shutil.copytree(killed_run, folders.checkpoints)
    return Path(folders.checkpoints)


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 3]


def _flip_one_bit(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1 :]


@pytest.mark.parametrize("damage", [_truncate, _flip_one_bit], ids=["truncated", "bit-flipped"])
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning_and_the_previous_used(
    killed_copy, start_training, folders, damage
):
    newest, previous = committed_checkpoints(LocalCheckpointStore(killed_copy).names())[:2]
    data_file = killed_copy / f"{newest}.pt"
    data_file.write_bytes(damage(data_file.read_bytes()))

    restart = start_training(nproc=1)  # the same epochs: a resume under others is refused
    # Which checkpoint resumes is decided at the start; an eviction notice then ends the restart early.
    resumed = restart.wait_for(lambda event: event["event"] == "resumed")
    restart.send_signal(signal.SIGTERM)
    assert restart.finish() == PREEMPTED_EXIT_CODE
    assert resumed["checkpoint"] == previous
    log_lines = (folders.logs / "attempt-1.log").read_text().splitlines()
    warnings = [line for line in log_lines if "skipping" in line]
    assert len(warnings) == 1 and newest in warnings[0]
    assert "truncated" in warnings[0] if damage is _truncate else "fails its checksum" in warnings[0]


def test_leftovers_of_a_save_killed_midway_are_ignored_and_cleared(killed_copy, start_training, folders):
    last_committed = newest_record(folders.checkpoints)
    # What a kill during the next save leaves: a half-written temp file, and data whose record never came.
    leftovers = {".step-0000000099-a001.pt.tmp-0123abcd": b"half a checkpoint"}
    leftovers["step-0000000099-a001.pt"] = b"data without its commit record"
    for name, data in leftovers.items():
        (killed_copy / name).write_bytes(data)

    restart = start_training(nproc=1)
    assert restart.finish() == 0
    assert resumed_event(restart)["checkpoint"] == last_committed.name
    assert {path.name for path in killed_copy.iterdir()} & set(leftovers) == set()


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


# -- a checkpoint that cannot be trusted costs itself only (issue 41) ----------------------------------

NO_INTERVAL_SAVES = ("--checkpoint-every-steps", "1000")  # the restart's only save is its final one


def test_a_record_whose_state_is_another_steps_is_refused_and_the_one_before_resumes(
    killed_copy, start_training, folders
):
    """Step 20's record over step 10's data (its size and sha256 in the record, so the data verifies): the
    state it holds says step 10, the record step 20. It is refused, saying so, and step 10's checkpoint
    resumes, at its own step."""
    newest, previous = committed_checkpoints(LocalCheckpointStore(killed_copy).names())[:2]
    (killed_copy / f"{newest}.pt").write_bytes((killed_copy / f"{previous}.pt").read_bytes())
    record = json.loads((killed_copy / f"{newest}.json").read_text())
    older = json.loads((killed_copy / f"{previous}.json").read_text())
    record.update(sha256=older["sha256"], size=older["size"])
    (killed_copy / f"{newest}.json").write_text(json.dumps(record))

    restart = start_training(nproc=1, extra=NO_INTERVAL_SAVES)
    assert restart.finish() == 0
    resumed = resumed_event(restart)
    assert (resumed["checkpoint"], resumed["step"]) == (previous, older["step"])
    log = (folders.logs / "attempt-1.log").read_text()
    assert (
        f"skipping checkpoint {newest} in {killed_copy}: checkpoint {newest} holds a state that disagrees "
        f"with its record: step {older['step']} (its record: {record['step']})"
    ) in log


def test_a_checkpoint_found_corrupt_is_never_kept_in_place_of_a_valid_one(
    killed_copy, start_training, folders
):
    """Keep two: step 20's checkpoint is damaged, so the restart resumes step 10's. Its own save (the final)
    makes three; the two kept are the new one and step 10's, never the damaged one, so one more fault does
    not leave nothing to resume from."""
    newest, previous = committed_checkpoints(LocalCheckpointStore(killed_copy).names())[:2]
    data_file = killed_copy / f"{newest}.pt"
    data_file.write_bytes(_flip_one_bit(data_file.read_bytes()))

    restart = start_training(nproc=1, extra=NO_INTERVAL_SAVES)
    assert restart.finish() == 0
    assert resumed_event(restart)["checkpoint"] == previous
    final = newest_record(folders.checkpoints)
    assert final.reason == "final" and final.attempt == 2
    assert committed_checkpoints(LocalCheckpointStore(killed_copy).names()) == [final.name, previous]
    assert not list(killed_copy.glob(f"{newest}.*"))
    log = (folders.logs / "attempt-1.log").read_text()
    assert f"removing checkpoint {newest} in {killed_copy}: it failed to load (" in log
