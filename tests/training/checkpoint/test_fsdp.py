"""FSDP end to end: real `retrain train --strategy fsdp` (torchrun, gloo, CPU), its sharded checkpoints, kills
of the whole process tree, resumes on another world size, and Blob Storage (Azurite)."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from helpers.training.run_outputs import newest_record, read_metadata
from helpers.training.small_run import NO_TRACKING, STEPS_PER_EPOCH, TOTAL_STEPS
from helpers.training.training_process import (
    is_checkpoint,
    is_step,
    kill_process_tree,
    kill_twice_then_finish,
    resumed_event,
    train_to_end,
)
from helpers.training.warm_training import WarmStarts
from torch.distributed.checkpoint.metadata import MetadataIndex

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.open_store import CONNECTION_STRING_VARIABLE
from training.checkpoint.records import LAYOUT_SHARDED, CheckpointRecord, committed_checkpoints
from training.checkpoint.sharded import CHECKSUM, SHARD_SUFFIX, checksum
from training.engine.preemption import PREEMPTED_EXIT_CODE

FSDP = ("--strategy", "fsdp")


@pytest.fixture(scope="module")
def fsdp_uninterrupted(
    prepared_data: Path, tmp_path_factory: pytest.TempPathFactory, warm_starts: WarmStarts
) -> dict:
    """The small run under FSDP on 2 processes, never interrupted."""
    root = tmp_path_factory.mktemp("fsdp-uninterrupted")
    train_to_end(warm_starts, prepared_data, root, extra=FSDP)
    return read_metadata(root / "out")


def test_fsdp_sigkill_twice_then_restart_ends_with_the_uninterrupted_weights(
    fsdp_uninterrupted, start_training, folders
):
    durable_at_kill, resumes = kill_twice_then_finish(lambda: start_training(extra=FSDP), folders.checkpoints)

    assert [(event["step"], event["epoch"], event["position"]) for event in resumes] == [
        (step, step // STEPS_PER_EPOCH, (step % STEPS_PER_EPOCH) * 32) for step in durable_at_kill
    ]
    metadata = read_metadata(folders.out)
    assert metadata["weights_sha256"] == fsdp_uninterrupted["weights_sha256"]
    assert metadata["steps"] == TOTAL_STEPS and metadata["strategy"] == "fsdp"
    assert [attempt["ended"] for attempt in metadata["attempts"]] == [
        "interrupted",
        "interrupted",
        "completed",
    ]
    # Each rank wrote its own shard; the record lists both and DCP's metadata, with sizes and checksums.
    record = newest_record(folders.checkpoints)
    assert record.layout == LAYOUT_SHARDED and record.checksum == CHECKSUM and record.world_size == 2
    assert sorted(record.objects) == [
        f"{record.name}.dcp",
        f"{record.name}.shard-00000",
        f"{record.name}.shard-00001",
    ]
    assert metadata["checkpoints"]["layout"] == LAYOUT_SHARDED


# A global batch both 2 and 3 processes divide: 1421 rows / 48 = 29 steps per epoch, 58 in all, validated at
# the end of each epoch (the best weights ride in every checkpoint after step 29), checkpoints every 10 steps,
# all of them kept so that a resume can start from any.
RESHARD_STEPS_PER_EPOCH = 29
RESHARD_RUN = [
    "--epochs", "2", "--global-batch-size", "48", "--task-option", "hidden_width=64", "--seed", "7",
    "--checkpoint-every-steps", "10", "--checkpoint-every-seconds", "off", "--keep-checkpoints", "10",
    "--validate-every-epochs", "1", "--deterministic", *FSDP, *NO_TRACKING,
]  # fmt: skip
# Another world size sums each step's gradients in another order, so the weights differ in their last bits
# and the validation scores by a few of the 188 validation samples at most.
ACCURACY_TOLERANCE = 0.03
LOSS_TOLERANCE = 0.05  # relative


def test_an_fsdp_checkpoint_of_2_ranks_resumes_on_1_and_on_3_resharded(
    prepared_data: Path, tmp_path: Path, warm_starts: WarmStarts
):
    def train(name: str, nproc: int, checkpoints: Path) -> tuple[int, dict | None, list[dict], str]:
        out, log = tmp_path / name / "out", tmp_path / name / "stderr.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        locations = [
            "--nproc",
            str(nproc),
            "--data",
            str(prepared_data),
            "--out",
            str(out),
            "--checkpoints",
            str(checkpoints),
        ]
        process = warm_starts.training([*locations, *RESHARD_RUN], stderr=log.open("w"))
        code = process.finish()
        metadata = read_metadata(out) if (out / "metadata.json").exists() else None
        return code, metadata, process.events_seen, log.read_text()

    reference_checkpoints = tmp_path / "reference" / "checkpoints"
    code, reference, _, log = train("reference", 2, reference_checkpoints)
    assert code == 0, log[-3000:]
    assert reference is not None and reference["steps"] == 2 * RESHARD_STEPS_PER_EPOCH

    # Where the 2-rank run stood after step 40: its checkpoints up to step 40 (step 29's best among them).
    resumes_from = "step-0000000040-a001"
    for nproc in (1, 3):
        checkpoints = tmp_path / f"on-{nproc}" / "checkpoints"
        shutil.copytree(reference_checkpoints, checkpoints)
        for name in committed_checkpoints(LocalCheckpointStore(checkpoints).names()):
            if name > resumes_from:
                for path in checkpoints.glob(f"{name}.*"):
                    path.unlink()
        code, metadata, events, log = train(f"on-{nproc}", nproc, checkpoints)
        assert code == 0, log[-3000:]
        assert metadata is not None
        resumed = next(event for event in events if event["event"] == "resumed")
        assert (resumed["checkpoint"], resumed["step"], resumed["epoch"], resumed["position"]) == (
            resumes_from,
            40,
            1,
            (40 - RESHARD_STEPS_PER_EPOCH) * 48,
        )
        first_step = next(event for event in events if event["event"] == "step")
        assert (first_step["step"], first_step["position"]) == (41, (41 - RESHARD_STEPS_PER_EPOCH) * 48)
        # The same global batch, sample order and step count; metadata.json records the change of world.
        assert metadata["steps"] == reference["steps"] and metadata["global_batch_size"] == 48
        assert [attempt["world_size"] for attempt in metadata["attempts"]] == [2, nproc]
        assert metadata["world_size"] == nproc and f"world size changed from 2 to {nproc}" in log
        # The best validated weights (step 29's) came back with the checkpoint: the same best step.
        assert metadata["validation"]["validations"] == reference["validation"]["validations"]
        assert metadata["validation"]["best_step"] == reference["validation"]["best_step"]
        ours, theirs = metadata["final_metrics"], reference["final_metrics"]
        assert abs(ours["validation_accuracy"] - theirs["validation_accuracy"]) <= ACCURACY_TOLERANCE
        assert (
            abs(ours["validation_loss"] - theirs["validation_loss"])
            <= LOSS_TOLERANCE * theirs["validation_loss"]
        )


def test_an_fsdp_run_whose_newest_shard_is_damaged_resumes_on_3_ranks_from_the_one_before(
    prepared_data: Path, tmp_path: Path, warm_starts: WarmStarts
):
    """Each rank checks the objects it reads; one rank's failure moves every rank to the previous one."""
    checkpoints = tmp_path / "checkpoints"
    locations = [
        "--data",
        str(prepared_data),
        "--out",
        str(tmp_path / "out"),
        "--checkpoints",
        str(checkpoints),
    ]
    first = warm_starts.training(
        ["--nproc", "2", *locations, *RESHARD_RUN], stderr=(tmp_path / "1.log").open("w")
    )
    first.wait_for(is_step(25))
    first.send_signal(signal.SIGTERM)
    assert first.finish() == PREEMPTED_EXIT_CODE
    newest, previous = committed_checkpoints(LocalCheckpointStore(checkpoints).names())[:2]
    shard = checkpoints / f"{newest}.shard-00001"
    data = shard.read_bytes()
    shard.write_bytes(
        data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0x01]) + data[len(data) // 2 + 1 :]
    )

    log = tmp_path / "2.log"
    restart = warm_starts.training(["--nproc", "3", *locations, *RESHARD_RUN], stderr=log.open("w"))
    assert restart.finish() == 0, log.read_text()[-3000:]
    assert resumed_event(restart)["checkpoint"] == previous
    warnings = [line for line in log.read_text().splitlines() if "skipping checkpoint" in line]
    assert len(warnings) == 1 and newest in warnings[0] and f"{newest}.shard-00001" in warnings[0]


def test_fsdp_checkpoints_to_blob_storage_and_resumes_from_it(
    azurite, fsdp_uninterrupted, start_training, folders
):
    container = azurite.new_container()
    folders.checkpoints = f"{azurite.blob_endpoint}/{container.container_name}/runs/fsdp"
    credentials = {CONNECTION_STRING_VARIABLE: azurite.connection_string}

    process = start_training(extra=FSDP, env=credentials)
    process.wait_for(is_step(30))
    process.send_signal(signal.SIGTERM)
    assert process.finish() == PREEMPTED_EXIT_CODE
    blobs = {
        blob.name.removeprefix("runs/fsdp/") for blob in container.list_blobs(name_starts_with="runs/fsdp/")
    }
    preempted = max(name.split(".")[0] for name in blobs if name.startswith("step-"))
    assert {f"{preempted}.{suffix}" for suffix in ("json", "dcp", "shard-00000", "shard-00001")} <= blobs
    assert not any(name.endswith(".pt") for name in blobs)

    restart = start_training(extra=FSDP, env=credentials)
    assert restart.finish() == 0
    assert resumed_event(restart)["step"] >= 30
    metadata = read_metadata(folders.out)
    assert metadata["weights_sha256"] == fsdp_uninterrupted["weights_sha256"]
    assert metadata["checkpoints"]["location"].startswith("http://127.0.0.1")
    assert azurite.connection_string not in (folders.logs / "attempt-2.log").read_text()


def test_a_ddp_run_on_the_sharded_layout_spreads_its_writes_and_resumes_exactly(
    uninterrupted_run, start_training, folders
):
    """DDP ranks hold the same state; in the sharded layout DCP has each write a share of it."""
    sharded = ("--checkpoint-layout", "sharded")
    process = start_training(extra=sharded)
    process.wait_for(is_step(30))
    process.send_signal(signal.SIGTERM)
    assert process.finish() == PREEMPTED_EXIT_CODE
    record = newest_record(folders.checkpoints)
    assert record.layout == LAYOUT_SHARDED and record.reason == "preempted"
    shards = [entry["size"] for name, entry in sorted(record.objects.items()) if ".shard-" in name]
    assert len(shards) == 2 and min(shards) > 0.2 * sum(shards)  # both ranks wrote a real share

    restart = start_training(extra=sharded)
    assert restart.finish() == 0
    assert resumed_event(restart)["checkpoint"] == record.name
    metadata = read_metadata(folders.out)
    assert metadata["weights_sha256"] == uninterrupted_run["weights_sha256"]
    assert metadata["strategy"] == "ddp" and metadata["checkpoints"]["layout"] == LAYOUT_SHARDED


@pytest.mark.parametrize(("poison", "stopped_at"), [("inf", 20), ("gradient", 21)])
def test_one_ranks_non_finite_step_under_fsdp_stops_every_rank_before_any_shard_of_it_is_saved(
    start_training, folders, poison, stopped_at
):
    """Step 20's save is due when rank 1's loss turns infinite: every rank settles that step's verdict
    before saving its shard, so none saves it, and all stop together (test_nonfinite_loss.py, under DDP).
    Or rank 1's loss stays finite but its gradients are NaN: every shard of the weights the update leaves
    is, each rank's save checks its staged shard in its writer and refuses, so no shard is left, and the
    next step's loss stops the run."""
    task = str(Path(__file__).parents[2] / "helpers" / "training" / "diverging_task.py") + ":DivergingTabular"
    diverging = ["--task", task, "--task-option", "diverge_at_step=20", "--task-option", "ranks=[1]"]
    process = start_training(nproc=2, extra=[*FSDP, *diverging, "--task-option", f"poison={poison}"])
    assert process.finish() == 65
    diverged = next(event for event in process.events_seen if event["event"] == "diverged")
    assert diverged["step"] == stopped_at
    log = (folders.logs / "attempt-1.log").read_text()
    assert log.count("step 20 is not checkpointed: ") == 1  # rank 0 reports it, once
    assert not (folders.out / "model.pt").exists()
    names = LocalCheckpointStore(Path(folders.checkpoints)).names()
    assert committed_checkpoints(names) == ["step-0000000010-a001"]
    assert not [name for name in names if name.startswith("step-0000000020")]  # no shard of it, either


def test_saves_due_by_time_are_rank_0s_vote_and_every_rank_saves_the_same_step(start_training, folders):
    """The clock is rank 0's alone; the step exchange carries its vote, so both ranks save at one step (a
    save only one rank joined would never complete). The interval is shorter than any step."""
    by_time = ["--checkpoint-every-steps", "off", "--checkpoint-every-seconds", "0.000001"]
    process = start_training(extra=[*FSDP, *by_time])
    assert process.finish() == 0
    saves = [event for event in process.events_seen if event["event"] == "checkpoint"]
    intervals = [event["step"] for event in saves if event["reason"] == "interval"]
    # A vote cast at the end of step k is read by every rank at the end of step k+1, which saves.
    assert intervals and intervals[0] == 2 and len(intervals) == len(set(intervals))
    record = newest_record(folders.checkpoints)
    assert record.reason == "final" and len([name for name in record.objects if ".shard-" in name]) == 2


@pytest.mark.parametrize(
    "strategy", [FSDP, ("--strategy", "ddp", "--checkpoint-layout", "sharded")], ids=["fsdp", "ddp-sharded"]
)
def test_validation_every_epoch_loses_no_sharded_save(
    prepared_data: Path, tmp_path: Path, warm_starts: WarmStarts, strategy: tuple[str, ...]
):
    """Issue 41: the best validated weights appear in rank 0's state alone, at the first validation that
    improves (step 44), so from then on rank 0's state has another layout than rank 1's. Every save planned
    (every 10 steps, and the final one) has its commit record all the same, those after step 44 with the
    best weights in them, and the run's summary says no save was lost."""
    validated = [*strategy, "--validate-every-epochs", "1", "--keep-checkpoints", "20"]
    process = train_to_end(warm_starts, prepared_data, tmp_path, extra=validated)
    store = LocalCheckpointStore(tmp_path / "checkpoints")
    checkpointer = Checkpointer(store, keep_last=20)
    records = [each for each in checkpointer.resume_candidates() if isinstance(each, CheckpointRecord)]
    planned = [*range(10, TOTAL_STEPS, 10), TOTAL_STEPS]
    assert sorted(record.step for record in records) == planned
    for record in records:
        holds_best = checkpointer.sharded_metadata(record).holds("best.")
        assert holds_best == (record.step > STEPS_PER_EPOCH), record.name
    metadata = read_metadata(tmp_path / "out")
    summary = metadata["checkpoints"]
    assert (summary["saved"], summary["failed"], summary["not_saved"]) == (len(planned), 0, [])
    assert metadata["warnings"] == [] and metadata["validation"]["validations"] == 2
    done = next(event for event in process.events_seen if event["event"] == "done")
    assert done["checkpoints_not_saved"] is None
    assert "not saved" not in (tmp_path / "stderr.log").read_text()
    checkpointer.close()


def test_an_fsdp_record_over_another_steps_shard_is_refused_and_the_one_before_resumes(
    fsdp_uninterrupted, start_training, folders
):
    """Issue 41: the newest checkpoint holds, as its own, the shard of the checkpoint before it that holds the
    run's progress, and its record that shard's size and checksum under its new name (as a tool that
    rewrote the record would), so every object verifies. Loaded, its state says the older step and its
    weights are half of each: it is refused on every rank, the checkpoint before it resumes, and the run
    ends with the uninterrupted run's weights."""
    process = start_training(extra=FSDP)
    process.wait_for(is_checkpoint(20))
    kill_process_tree(process)
    checkpoints = Path(folders.checkpoints)
    store = LocalCheckpointStore(checkpoints)
    newest, previous = committed_checkpoints(store.names())[:2]
    reader = Checkpointer(store)
    layout = reader.sharded_metadata(newest_record(folders.checkpoints))
    reader.close()
    shard = layout.dcp.storage_data[MetadataIndex("run")].shard  # the shard holding the progress
    swapped = f"{newest}{SHARD_SUFFIX}{shard:05d}"
    data = (checkpoints / f"{previous}{SHARD_SUFFIX}{shard:05d}").read_bytes()
    (checkpoints / swapped).write_bytes(data)
    record = json.loads((checkpoints / f"{newest}.json").read_text())
    record["objects"][swapped] = checksum(data, swapped).to_dict()
    record["size"] = sum(entry["size"] for entry in record["objects"].values())
    (checkpoints / f"{newest}.json").write_text(json.dumps(record))

    restart = start_training(extra=FSDP)
    assert restart.finish() == 0
    resumed = resumed_event(restart)
    assert resumed["checkpoint"] == previous and resumed["step"] == int(previous[5:15])
    log = (folders.logs / "attempt-2.log").read_text()
    assert f"checkpoint {newest} holds a state that disagrees with its record: step {resumed['step']}" in log
    assert f"removing checkpoint {newest} in {checkpoints}: it failed to load (" in log  # never kept
    assert read_metadata(folders.out)["weights_sha256"] == fsdp_uninterrupted["weights_sha256"]
