"""`--checkpoint-every-seconds auto`: the interval chosen from the measured checkpoint cost, and a run that
measures, announces and then follows it, afresh in every attempt."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from core.errors import InputError
from core.flags import config_to_argv
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.interval import (
    FALLBACK_INTERVAL_SECONDS,
    RULE_DALY,
    RULE_FALLBACK,
    RULE_WRITE_FLOOR,
    IntervalCalibration,
    choose_interval,
)
from training.checkpoint.local_store import LocalCheckpointStore
from training.engine.config import AUTO_INTERVAL, DEFAULT_MTBE_HOURS, TrainConfig
from training.engine.distributed import init_distributed
from training.engine.preemption import PreemptionNotice
from training.engine.progress import describe
from training.engine.tracking import make_tracker
from training.engine.train_args import add_train_arguments, config_from_args
from training.engine.trainer import COMPLETED, PREEMPTED, Trainer
from training.tasks.loader import load_task

# -- the choice: Daly's interval for the measured cost, floored at twice the write ------------------------


def test_the_measured_cost_gives_dalys_interval():
    # C = 0.5 s, M = 1 h: Young sqrt(2 * 0.5 * 3600) = 60 s; Daly 60 * (1 + (1/120)/3 + (1/14400)/9) - 0.5.
    choice = choose_interval(cost_seconds=0.5, write_seconds=3.0, mtbe_hours=1)
    assert choice.rule == RULE_DALY
    assert choice.measured is not None and choice.measured.young_seconds == pytest.approx(60.0)
    assert choice.interval_seconds == choice.measured.daly_seconds == pytest.approx(59.5 + 1 / 6 + 1 / 2160)
    assert (choice.measured.cost_seconds, choice.measured.write_seconds, choice.mtbe_hours) == (0.5, 3.0, 1)


def test_the_interval_is_never_shorter_than_twice_the_write():
    # C = 0.5 ms, M = 0.1 h: Young sqrt(2 * 0.0005 * 360) = 0.6 s, Daly just under it; a 2 s write wins.
    choice = choose_interval(cost_seconds=0.0005, write_seconds=2.0, mtbe_hours=0.1)
    assert choice.rule == RULE_WRITE_FLOOR
    assert choice.interval_seconds == 4.0
    assert choice.measured is not None
    assert choice.measured.young_seconds == pytest.approx(0.6) and choice.measured.daly_seconds < 0.6


def test_a_stall_too_short_for_the_clock_still_gives_an_interval():
    choice = choose_interval(cost_seconds=0.0, write_seconds=0.0, mtbe_hours=1)
    assert choice.measured is not None and choice.measured.cost_seconds == 0.0 and choice.rule == RULE_DALY
    # the smallest cost counted
    assert choice.measured.young_seconds == pytest.approx(math.sqrt(2 * 1e-6 * 3600))


@pytest.mark.parametrize(
    ("cost", "write", "mtbe", "message"),
    [
        (-0.1, 1.0, 1.0, "checkpoint cost -0.1: expected a measured number of seconds >= 0"),
        (0.1, math.nan, 1.0, "checkpoint write time nan: expected a measured number of seconds >= 0"),
        (True, 1.0, 1.0, "checkpoint cost True: expected"),
        (0.1, 1.0, 0, "--mtbe-hours must be a number of hours > 0, got 0"),
    ],
)
def test_bad_measurements_and_mtbe_are_refused_in_one_line(cost, write, mtbe, message):
    with pytest.raises(InputError, match=message):
        choose_interval(cost, write, mtbe)


# -- the calibration: warm-up save ignored, the slowest measured save counts --------------------------------


def test_the_warm_up_save_is_ignored_and_the_slowest_measured_save_counts():
    calibration = IntervalCalibration(mtbe_hours=1)
    saves = [(9.0, 9.0), (0.5, 1.0), (0.3, 2.0)]  # warm-up (buffer allocation), then two measured
    choices = []
    for blocked, write in saves:
        assert calibration.wants_save()
        calibration.save_started()
        assert not calibration.wants_save()  # never a second save while one is in flight
        choices.append(calibration.observe(blocked, write))
    assert choices[:2] == [None, None]
    assert choices[2] == choose_interval(0.5, 2.0, 1, measured_saves=2)
    assert calibration.interval_seconds == choices[2].interval_seconds
    assert not calibration.wants_save() and calibration.observe(0.1, 0.1) is None  # decided once


def test_failed_saves_are_retried_and_then_give_way_to_the_fallback():
    calibration = IntervalCalibration(mtbe_hours=1, max_failed_saves=3)
    for _ in range(2):
        calibration.save_started()
        assert calibration.observe(0.1, None) is None and calibration.wants_save()
    calibration.save_started()
    choice = calibration.observe(0.1, None)
    assert (choice.rule, choice.interval_seconds, choice.failed_saves) == (
        RULE_FALLBACK,
        FALLBACK_INTERVAL_SECONDS,
        3,
    )
    # The same flat keys as a measured choice's, the measurements null: metadata.json readers see one form.
    assert choice.fields().keys() == choose_interval(0.5, 2.0, 1).fields().keys()
    assert (choice.fields()["cost_seconds"], choice.fields()["measured_saves"]) == (None, 0)
    assert describe({"event": "checkpoint_interval", "step": 4, **choice.fields()}) == (
        "checkpoint interval 300 s (fallback): 3 measuring saves failed"
    )


def test_a_bad_mtbe_is_refused_before_the_first_save():
    with pytest.raises(InputError, match="--mtbe-hours"):
        IntervalCalibration(mtbe_hours=-1)


def test_the_announcement_reads_as_a_sentence():
    daly = choose_interval(cost_seconds=0.13, write_seconds=0.84, mtbe_hours=12)
    floored = choose_interval(cost_seconds=0.0005, write_seconds=2.0, mtbe_hours=0.1)
    assert describe({"event": "checkpoint_interval", "step": 3, **daly.fields()}) == (
        "checkpoint interval 106 s (Daly's optimum); a save blocks training 130 ms and is written in "
        "840 ms; mean time between evictions 12 h"
    )
    assert describe({"event": "checkpoint_interval", "step": 3, **floored.fields()}) == (
        "checkpoint interval 4 s (twice the write time: Daly's 600 ms would queue saves); a save blocks "
        "training 0.5 ms and is written in 2 s; mean time between evictions 0.1 h"
    )


# -- the options --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_train_arguments(parser)
    return parser


def _config(tmp_path: Path, *extra: str) -> TrainConfig:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    places = ["--data", str(data), "--out", str(tmp_path / "out"), "--checkpoints", str(tmp_path / "ckpt")]
    return config_from_args(_parser().parse_args([*places, *extra]), {}, tmp_path)


@pytest.mark.parametrize(
    ("extra", "seconds", "mtbe"),
    [
        ((), 300.0, DEFAULT_MTBE_HOURS),
        (("--checkpoint-every-seconds", "AUTO", "--mtbe-hours", "0.5"), AUTO_INTERVAL, 0.5),
        (("--checkpoint-every-seconds", "off"), None, DEFAULT_MTBE_HOURS),
        (("--checkpoint-every-seconds", "90.5", "--mtbe-hours", "3"), 90.5, 3.0),
    ],
)
def test_config_to_argv_rebuilds_the_config_exactly(tmp_path, extra, seconds, mtbe):
    config = _config(tmp_path, "--no-mlflow", "--checkpoint-every-steps", "7", *extra)
    assert (config.checkpoint_every_seconds, config.mtbe_hours) == (seconds, mtbe)
    assert config_from_args(_parser().parse_args(config_to_argv(config)), {}, tmp_path) == config
    tracked = _config(tmp_path, "--mlflow-tracking-uri", "sqlite:///x.db", "--deterministic", *extra)
    assert config_from_args(_parser().parse_args(config_to_argv(tracked)), {}, tmp_path) == tracked


def test_the_task_and_its_options_round_trip_with_single_options_over_the_json_object(tmp_path):
    config = _config(
        tmp_path,
        *("--task", "tasks/house.py:HousePrices", "--task-options", '{"size": [16, 8], "name": "a b"}'),
        *("--task-option", "size=24", "--task-option", "augment=false", "--task-option", "label=species"),
    )

    assert config.task == "tasks/house.py:HousePrices"
    assert config.task_options == {"size": 24, "name": "a b", "augment": False, "label": "species"}
    assert config_from_args(_parser().parse_args(config_to_argv(config)), {}, tmp_path) == config
    assert {"task", "task_options"} <= set(config.trajectory())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--mtbe-hours", "-1"), "--mtbe-hours -1: expected a number of hours > 0"),
        (("--mtbe-hours", "inf"), "--mtbe-hours inf: expected a number of hours > 0"),
        (
            ("--checkpoint-every-seconds", "0"),
            "--checkpoint-every-seconds 0: expected a number of seconds > 0",
        ),
    ],
)
def test_bad_interval_options_are_refused_naming_the_flag(tmp_path, extra, message):
    with pytest.raises(InputError, match=message):
        _config(tmp_path, "--no-mlflow", *extra)


def test_an_interval_that_is_neither_seconds_auto_nor_off_is_refused_by_the_parser(tmp_path):
    with pytest.raises(argparse.ArgumentError, match="expected a number of seconds, 'auto' or 'off'"):
        _config(tmp_path, "--checkpoint-every-seconds", "soon")


# -- a real run: measure, announce, follow; and again after a resume -----------------------------------------

MTBE_HOURS = 0.001  # 3.6 s: a short interval, and either rule may win depending on this machine's storage
STEPS_PER_EPOCH = 22  # 1421 training rows // 64
# Once the interval is announced, each step takes this fraction of it: interval saves come every 4th step.
STEP_FRACTION = 3.5
SAVE_EVERY_STEPS = 4


class SimulatedTime:
    """The trainer's clock and its progress renderer in one, so that no assertion depends on wall time.

    While the trainer measures, time stands still and each reported step first waits until the save in
    flight is written, so the measurement takes a few steps however slowly the background writer runs on a
    loaded machine. Once the trainer announces its interval, every step takes 1/STEP_FRACTION of it. Given
    `evict_at`, the eviction notice arrives once that step is reported, as SIGTERM would deliver it.
    """

    def __init__(self, checkpointer: Checkpointer, notice: PreemptionNotice, evict_at: int | None) -> None:
        self.now = 0.0
        self.events: list[dict[str, Any]] = []
        self._checkpointer = checkpointer
        self._step_seconds: float | None = None
        self._notice, self._evict_at = notice, evict_at

    def __call__(self) -> float:
        return self.now

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event["event"] == "checkpoint_interval":
            self._step_seconds = event["interval_seconds"] / STEP_FRACTION
        elif event["event"] == "step" and self._step_seconds is None:
            assert self._checkpointer.wait_until_written(timeout=120), "a save took over 120 s"
        elif event["event"] == "step":
            self.now += self._step_seconds
        evicted = self._evict_at is not None and event["event"] == "step" and event["step"] >= self._evict_at
        if evicted and not self._notice.received:
            self._notice.received_at = self.now

    def close(self) -> None:
        pass

    def of_kind(self, kind: str, reason: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind and reason in (None, e.get("reason"))]


def _attempt(
    arguments: list[str], tmp_path: Path, evict_at: int | None = None
) -> tuple[TrainConfig, SimulatedTime]:
    config = config_from_args(_parser().parse_args(arguments), {}, tmp_path)
    checkpointer = Checkpointer(
        LocalCheckpointStore(Path(config.checkpoints)), keep_last=config.keep_checkpoints
    )
    notice = PreemptionNotice()
    time = SimulatedTime(checkpointer, notice, evict_at)
    tracker = make_tracker(
        config.mlflow_tracking_uri, config.mlflow_experiment, config.mlflow_artifact_location, is_primary=True
    )
    context = init_distributed("cpu", {})
    task = load_task(config.task, config.task_options)
    trainer = Trainer(
        config,
        context,
        task,
        task.load(config.data),
        checkpointer,
        tracker,
        time,
        launch_id="t",
        notice=notice,
        clock=time,
    )
    try:
        assert trainer.run().status == (COMPLETED if evict_at is None else PREEMPTED)
    finally:
        checkpointer.close()
    return config, time


def _check_attempt(time: SimulatedTime, first_step: int, last_step: int) -> dict[str, Any]:
    """The attempt measured at its first saves, chose Daly's interval (or the floor) from the slowest
    measured save, and then saved exactly when that interval had passed."""
    saves = time.of_kind("checkpoint", reason="interval")
    [announced] = time.of_kind("checkpoint_interval")
    warm_up, *measured = saves[:3]
    assert warm_up["step"] == first_step + 1  # the first minutes are protected at once
    # Each measuring save starts at the first step after the previous one was reported.
    assert measured[0]["step"] <= first_step + 3 and measured[1]["step"] <= first_step + 5
    assert measured[-1]["step"] <= announced["step"] <= first_step + 6 and announced["measured_saves"] == 2
    assert announced["cost_seconds"] == pytest.approx(max(s["blocked_ms"] for s in measured) / 1000)
    assert announced["write_seconds"] == max(s["write_seconds"] for s in measured)
    expected = choose_interval(announced["cost_seconds"], announced["write_seconds"], MTBE_HOURS, 2)
    chosen = {key: announced[key] for key in expected.fields()}
    assert chosen == expected.fields()
    followed = [s["step"] for s in saves[3:]]
    assert followed == list(range(announced["step"] + SAVE_EVERY_STEPS, last_step, SAVE_EVERY_STEPS))
    assert len(followed) >= 2
    line = describe(announced)
    assert line.startswith("checkpoint interval ") and line.endswith(f"between evictions {MTBE_HOURS:g} h")
    return chosen


def test_a_run_measures_announces_and_follows_its_interval_afresh_in_every_attempt(prepared_data, tmp_path):
    arguments = [
        "--data", str(prepared_data), "--out", str(tmp_path / "out"), "--checkpoints", str(tmp_path / "ckpt"),
        "--global-batch-size", "64", "--task-option", "hidden_width=64", "--seed", "7",
        "--checkpoint-every-steps", "off",
        "--checkpoint-every-seconds", "auto", "--mtbe-hours", str(MTBE_HOURS), "--progress", "none",
        "--mlflow-tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--mlflow-experiment", "auto",
        "--mlflow-artifact-location", (tmp_path / "artifacts").as_uri(),
    ]  # fmt: skip
    # Evicted after its first epoch, the run resumes: a new attempt, which measures its own saves again.
    _, first = _attempt([*arguments, "--epochs", "2"], tmp_path, evict_at=STEPS_PER_EPOCH)
    config, second = _attempt([*arguments, "--epochs", "2"], tmp_path)

    [evicted] = first.of_kind("preempted")
    chosen = [
        _check_attempt(first, 0, evicted["step"]),
        _check_attempt(second, evicted["step"], 2 * STEPS_PER_EPOCH),
    ]
    metadata = json.loads((config.out / "metadata.json").read_text())
    assert [attempt["checkpoint_interval"] for attempt in metadata["attempts"]] == chosen
    assert metadata["attempts"][1]["resumed_from"] is not None
    client = MlflowClient(config.mlflow_tracking_uri)
    announced = [first.of_kind("checkpoint_interval")[0], second.of_kind("checkpoint_interval")[0]]
    for metric, key in (
        ("checkpoint_interval_seconds", "interval_seconds"),
        ("checkpoint_cost_seconds", "cost_seconds"),
    ):
        history = client.get_metric_history(metadata["mlflow_run_id"], metric)
        assert sorted((m.step, m.value) for m in history) == [(a["step"], a[key]) for a in announced]
