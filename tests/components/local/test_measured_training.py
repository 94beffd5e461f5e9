"""What `retrain run`'s cost estimate takes as the model's measured training (components/local/measured.py):
the newest train step of the same model that ran to completion here, read from the run store as the local
runner leaves it; other models, reused, failed and unreadable trainings are passed over."""

from __future__ import annotations

import json
from pathlib import Path

from components.cost import MeasuredTraining
from components.local import RunRecord, RunStore, StepRecord
from components.local.measured import measured_training
from components.request import COMPLETED, FAILED


def _training(folder: Path, wall_seconds: float, steps: int, epochs: float, world_size: int = 1) -> Path:
    folder.mkdir(parents=True)
    metadata = {"format": "retrain-training/1", "wall_time_seconds": wall_seconds, "steps": steps}
    metadata |= {"epochs": epochs, "world_size": world_size}
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return folder


def _run(
    store: RunStore, second: int, model: str, model_dir: Path, status: str = COMPLETED, reused=False
) -> str:
    run_id = f"20261203-1000{second:02d}-abcdef"
    train = StepRecord("train", "train", status=status, reused=reused, outputs={"model": str(model_dir)})
    record = RunRecord(
        run_id=run_id,
        job_name=f"job-{second}",
        run_key="k",
        model_name=model,
        data_version="rd-0123456789abcdef",
        data_uri="/data",
        created_at=f"2026-12-03T10:00:{second:02d}+00:00",
        steps=(train,),
        status=status,
    )
    store.create(record)
    return run_id


def test_the_newest_training_of_the_model_that_ran_here_is_the_measurement(tmp_path: Path):
    store = RunStore(tmp_path / "runs")
    measured = _training(tmp_path / "measured", wall_seconds=120.0, steps=40, epochs=4.0, world_size=2)
    trained = _run(store, 1, "houses", measured)
    _run(store, 2, "houses", _training(tmp_path / "older", 10.0, 10, 1.0))  # newer, but its file breaks:
    (tmp_path / "older" / "metadata.json").write_text("{not json")
    _run(store, 3, "digits", _training(tmp_path / "digits", 1.0, 1, 1.0))  # another model
    _run(store, 4, "houses", measured, reused=True)  # reused: the run that trained it is named
    _run(store, 5, "houses", tmp_path / "failed", status=FAILED)

    assert measured_training(store, "houses") == MeasuredTraining(trained, 3.0, 10.0, 2)
    assert measured_training(store, "shapes") is None
    assert measured_training(RunStore(tmp_path / "nothing"), "houses") is None
