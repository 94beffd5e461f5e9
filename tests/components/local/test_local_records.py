"""The step cache's entries and the run records: immutable, atomic, and readable back."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from components.errors import PipelineError
from components.local.cache import ENTRY_FILE, CacheEntry, StepCache, cache_key
from components.local.runs import (
    ABANDONED,
    RUN_FILE,
    STEP_PID_FILE,
    RunRecord,
    RunStore,
    StepAttempt,
    StepRecord,
    new_run_id,
)
from components.request import COMPLETED, FAILED, RUNNING

KEY = "0" * 32


def staged_entry(
    cache: StepCache, text: str, key: str = KEY, run_id: str = "run-a"
) -> tuple[Path, CacheEntry]:
    staging = cache.stage("prep", run_id)
    (staging / "prepared").mkdir()
    (staging / "prepared" / "data.txt").write_text(text)
    entry = CacheEntry(
        "prep", key, staging, {"prepared": f"sha256:{text}"}, run_id, "2026-11-29T00:00:00+00:00"
    )
    return staging, entry


def test_cache_keys_are_canonical_and_change_with_any_ingredient():
    key = cache_key({"step": "prep", "inputs": {"a": "1", "b": None}})
    assert key == cache_key({"inputs": {"b": None, "a": "1"}, "step": "prep"})
    assert len(key) == 32 and int(key, 16) >= 0
    assert key != cache_key({"step": "prep", "inputs": {"a": "2", "b": None}})


def test_a_published_entry_is_found_with_its_output_hashes_and_is_read_only(tmp_path):
    cache = StepCache(tmp_path / "cache")
    assert cache.lookup("prep", KEY) is None
    staging, entry = staged_entry(cache, "one")

    published = cache.publish(staging, entry)

    assert published is not None and published.path == tmp_path / "cache" / "prep" / KEY
    assert not staging.exists()
    found = cache.lookup("prep", KEY)
    assert found is not None
    assert (found.output_hashes, found.run_id) == ({"prepared": "sha256:one"}, "run-a")
    assert (found.output_path("prepared") / "data.txt").read_text() == "one"
    assert stat.S_IMODE((found.output_path("prepared") / "data.txt").stat().st_mode) & 0o222 == 0


def test_an_existing_entry_is_never_replaced(tmp_path):
    cache = StepCache(tmp_path / "cache")
    cache.publish(*staged_entry(cache, "first"))
    staging, entry = staged_entry(cache, "second", run_id="run-b")

    assert cache.publish(staging, entry) is None
    assert staging.is_dir()  # the caller keeps these outputs elsewhere
    found = cache.lookup("prep", KEY)
    assert found is not None and found.run_id == "run-a"
    assert (found.output_path("prepared") / "data.txt").read_text() == "first"


def test_a_discarded_staging_folder_leaves_nothing(tmp_path):
    cache = StepCache(tmp_path / "cache")
    staging, _ = staged_entry(cache, "half")
    cache.discard(staging)
    assert list((tmp_path / "cache" / "prep").iterdir()) == []


def test_a_damaged_entry_is_a_one_line_error_saying_how_to_rebuild_it(tmp_path):
    cache = StepCache(tmp_path / "cache")
    published = cache.publish(*staged_entry(cache, "x"))
    assert published is not None
    for path in published.path.rglob("*"):
        path.chmod(0o755)
    (published.path / "prepared" / "data.txt").unlink()
    (published.path / "prepared").rmdir()
    with pytest.raises(
        PipelineError, match=r"outputs \['prepared'\] are missing; delete the folder to rebuild"
    ):
        cache.lookup("prep", KEY)
    (published.path / ENTRY_FILE).write_text("{not json")
    with pytest.raises(PipelineError, match=r"entry.json unreadable .*; delete the folder to rebuild it"):
        cache.lookup("prep", KEY)


def make_record(created_at: str, status: str = RUNNING) -> RunRecord:
    return RunRecord(
        run_id=new_run_id(created_at),
        job_name="retrain-digits-rd-0123456789abcdef",
        run_key="digits-rd-0123456789abcdef",
        model_name="digits",
        data_version="rd-0123456789abcdef",
        data_uri="/data",
        created_at=created_at,
        status=status,
        parameters={"epochs": "2"},
        steps=(
            StepRecord(
                "prep", "retrain_prep:1", status=COMPLETED, reused=True, outputs={"prepared_data": "/p"}
            ),
            StepRecord(
                "train",
                "retrain_train:1",
                status=FAILED,
                command=("python", "-m", "training.engine.worker"),
                attempts=(StepAttempt(1, 75, created_at, 1.5), StepAttempt(2, 1, created_at, 0.5)),
                log="/runs/x/train/log.txt",
            ),
        ),
    )


def test_run_records_round_trip_through_json():
    record = make_record("2026-11-29T10:00:00.000+00:00", FAILED)
    assert RunRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    assert record.run_id.startswith("20261129-100000-")


def test_a_record_is_saved_whole_and_listed_newest_first(tmp_path):
    store = RunStore(tmp_path / "runs")
    older, newer = make_record("2026-11-29T10:00:00.000+00:00"), make_record("2026-11-29T11:00:00.000+00:00")
    store.create(older)
    store.create(newer)
    store.save(older.with_step(StepRecord("prep", "retrain_prep:1", status=FAILED)))

    assert [record.run_id for record in store.list()] == [newer.run_id, older.run_id]
    assert store.list(limit=1) == [newer]
    assert store.load(older.run_id).step("prep").status == FAILED
    assert sorted(path.name for path in (tmp_path / "runs" / older.run_id).iterdir()) == [RUN_FILE]
    with pytest.raises(FileExistsError):
        store.create(newer)


def test_an_unreadable_record_is_skipped_when_listing(tmp_path, caplog):
    store = RunStore(tmp_path / "runs")
    good = make_record("2026-11-29T10:00:00.000+00:00")
    store.create(good)
    (tmp_path / "runs" / "20261129-090000-abcdef").mkdir()
    (tmp_path / "runs" / "20261129-090000-abcdef" / RUN_FILE).write_text("{")
    assert store.list() == [good]
    assert "skipping" in caplog.text
    with pytest.raises(PipelineError, match=r"run '20261129-090000-000000': no record at"):
        store.load("20261129-090000-000000")


def test_records_refuse_a_bad_status_or_run_id():
    with pytest.raises(PipelineError, match=r"step 'prep': status 'Done'; expected one of"):
        StepRecord("prep", "retrain_prep:1", status="Done")
    with pytest.raises(PipelineError, match=r"run id 'latest': expected YYYYmmdd-HHMMSS-<6 hex digits>"):
        RunRecord("latest", "j", "k", "m", "rd-0123456789abcdef", "/d", "2026-11-29T10:00:00+00:00", ())


def _legacy_record(tmp_path, step_pid: int | None) -> tuple[RunStore, RunRecord]:
    """A run Running at `train`, as written before runners were recorded (no `runner`), its step's pid
    file naming `step_pid`."""
    store = RunStore(tmp_path / "runs")
    record = make_record("2026-11-29T10:00:00.000+00:00")
    record = record.with_step(replace(record.step("train"), status=RUNNING, attempts=()))
    store.create(record)
    if step_pid is not None:
        store.step_dir(record.run_id, "train").mkdir(parents=True)
        (store.step_dir(record.run_id, "train") / STEP_PID_FILE).write_text(f"{step_pid}\n")
    return store, record


def test_a_run_recorded_before_runners_were_is_abandoned_once_its_steps_process_has_ended(tmp_path):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # its pid names no process now
    store, record = _legacy_record(tmp_path, ended.pid)

    loaded = store.load(record.run_id)

    assert loaded.status == ABANDONED and loaded.step("train").status == ABANDONED
    assert (
        loaded.error
        == f"abandoned during step 'train': its step's process (pid {ended.pid}) ended before the run did"
    )
    assert RunStore(tmp_path / "runs").load(record.run_id).status == ABANDONED  # saved once


def test_a_run_recorded_before_runners_were_is_left_running_while_its_steps_process_lives(tmp_path):
    store, record = _legacy_record(tmp_path, os.getpid())
    assert store.load(record.run_id).status == RUNNING


def test_a_run_recorded_before_runners_were_whose_step_left_no_pid_is_abandoned(tmp_path):
    store, record = _legacy_record(tmp_path, None)
    assert store.load(record.run_id).error == (
        "abandoned during step 'train': its step's process ended before the run did"
    )
