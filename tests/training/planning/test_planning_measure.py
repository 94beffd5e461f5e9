"""`retrain plan scaling --measure`: the fit against hand-computed points, the step timing from trainer
events, the orchestration with a timer of our own protocol, one real measurement with torchrun, and one
under FSDP."""

from __future__ import annotations

import io
import json
import math
import os
import struct
import tempfile
from pathlib import Path

import pytest

from core.errors import InputError, RetrainError
from training.cli import build_parser, main
from training.planning import cli as planning_cli
from training.planning.maths import (
    MeasuredRow,
    ScalingInputs,
    StepTime,
    fit_step_times,
    measured_rows,
    measured_scaling,
    scaling_plan,
)
from training.planning.measure import (
    MeasureSettings,
    StepTiming,
    TrainerStepTimer,
    _trained_under,
    default_global_batch_size,
    epochs_for,
    measure_step_times,
    steady_step_timing,
)

# -- the fit --------------------------------------------------------------------------------------------


def test_two_points_are_fitted_exactly():
    # step(1) = a = 10 ms; step(2) = a/2 + b = 8 ms, so b = 3 ms.
    fit = fit_step_times([StepTime(1, 0.010), StepTime(2, 0.008)])
    assert fit.compute_seconds == pytest.approx(0.010)
    assert fit.comm_seconds_per_doubling == pytest.approx(0.003)
    assert not fit.clamped
    assert fit.step_seconds(4) == pytest.approx(0.0025 + 0.006)


def test_three_points_by_least_squares():
    # u = 1/N = (1, 1/2, 1/4), v = log2 N = (0, 1, 2), y = (10, 6, 5): uu = 21/16, uv = 1, vv = 5,
    # uy = 57/4, vy = 16, determinant 89/16, so a = (57/4·5 - 16)/(89/16) = 884/89 and
    # b = (16·21/16 - 57/4)/(89/16) = 108/89.
    fit = fit_step_times([StepTime(1, 10), StepTime(2, 6), StepTime(4, 5)])
    assert fit.compute_seconds == pytest.approx(884 / 89)
    assert fit.comm_seconds_per_doubling == pytest.approx(108 / 89)
    assert not fit.clamped


def test_repeated_counts_are_averaged_by_the_least_squares():
    # Two measurements at N = 2 weigh as their mean would: a = 10, a/2 + b = 7.
    fit = fit_step_times([StepTime(1, 10), StepTime(2, 6), StepTime(2, 8)])
    assert (fit.compute_seconds, fit.comm_seconds_per_doubling) == (pytest.approx(10), pytest.approx(2))


def test_superlinear_noise_is_clamped_to_no_communication():
    # Free fit: a = 10, b = 4 - 5 = -1 < 0. With b = 0: a = Σuy/Σu² = (10 + 2)/(1 + 1/4) = 9.6.
    fit = fit_step_times([StepTime(1, 10), StepTime(2, 4)])
    assert fit.clamped
    assert fit.compute_seconds == pytest.approx(9.6)
    assert fit.comm_seconds_per_doubling == 0


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([StepTime(2, 1.0), StepTime(2, 1.1)], "2 or more distinct process counts, got [2]"),
        ([StepTime(1, 1.0)], "2 or more distinct process counts, got [1]"),
        ([], "2 or more distinct process counts, got []"),
        ([StepTime(1, 1.0), StepTime(2, 0.0)], "step times must be seconds > 0, got 0.0 at 2 processes"),
        ([StepTime(1, -1.0), StepTime(2, 1.0)], "step times must be seconds > 0"),
        ([StepTime(1, math.nan), StepTime(2, 1.0)], "step times must be seconds > 0"),
        ([StepTime(0, 1.0), StepTime(2, 1.0)], "whole numbers >= 1, got 0"),
        # a/2 + b = 1 and a/4 + 2b = 3 give a = -4/3: no positive single-process time explains them.
        ([StepTime(2, 1.0), StepTime(4, 3.0)], "grow faster with the process count"),
    ],
)
def test_the_fit_refuses_what_it_cannot_fit(points, message):
    with pytest.raises(InputError, match=r"^scaling fit: ") as caught:
        fit_step_times(points)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_measured_rows_compare_with_the_measured_single_process_step():
    points = [StepTime(1, 0.010), StepTime(2, 0.008)]
    rows = measured_rows(points, fit_step_times(points))
    assert rows[0] == MeasuredRow(1, 0.010, 1.0, 1.0, pytest.approx(0.010))
    assert (rows[1].speedup, rows[1].efficiency) == (pytest.approx(1.25), pytest.approx(0.625))
    assert rows[1].fitted_step_seconds == pytest.approx(0.008)


def test_without_a_single_process_point_speedup_is_against_the_fitted_one():
    # a/2 + b = 6 and a/4 + 2b = 5: a = 28/3, so the 2-process speedup is (28/3)/6 = 14/9.
    points = [StepTime(2, 6), StepTime(4, 5)]
    rows = measured_rows(points, fit_step_times(points))
    assert rows[0].speedup == pytest.approx(14 / 9)


def test_the_fit_becomes_the_modelled_plan_for_the_reference_run():
    # a = 36 ms, b = 21.6 - 18 = 3.6 ms; 100000 steps: T1 = 3600 s = 1 h, k = 360 s = 0.1 h.
    result = measured_scaling([StepTime(1, 0.036), StepTime(2, 0.0216)], 100_000, (1, 2, 4))
    assert result.single_gpu_hours == pytest.approx(1)
    assert result.comm_hours_per_doubling == pytest.approx(0.1)
    assert result.plan == scaling_plan(
        ScalingInputs(result.single_gpu_hours, result.comm_hours_per_doubling, (1, 2, 4))
    )
    assert result.plan.rows[1].wall_hours == pytest.approx(0.6)  # 1/2 + 0.1
    assert result.plan.recommended_gpus == 2  # 4 GPUs: 1/0.45/4 = 0.556 < 0.8


@pytest.mark.parametrize("run_steps", [0, -5, 1.5, True])
def test_run_steps_must_be_a_positive_whole_number(run_steps):
    with pytest.raises(InputError, match=r"^--run-steps must be a whole number >= 1"):
        measured_scaling([StepTime(1, 1), StepTime(2, 1)], run_steps, (1, 2))


# -- timing the trainer's steps -------------------------------------------------------------------------


def step(number: int, samples_per_second: float) -> dict:
    return {
        "event": "step",
        "step": number,
        "total_steps": 10,
        "loss": 1.0,
        "samples_per_second": samples_per_second,
    }


def test_the_step_time_is_the_median_after_warm_up():
    # Steps 1-5 are skipped (the first three report no rate yet); 64 samples / rate for steps 6-10:
    # 10, 20, 10, 5, 10 ms, median 10 ms. The start and done events are not steps.
    rates = [0, 0, 0, 1, 1, 6400, 3200, 6400, 12800, 6400]
    events = [{"event": "start"}, *(step(n, rate) for n, rate in enumerate(rates, 1)), {"event": "done"}]
    assert steady_step_timing(events, 64, warmup_steps=5) == StepTiming(pytest.approx(0.010), 5)


def test_too_few_timed_steps_are_refused():
    events = [step(n, 6400) for n in range(1, 9)]
    with pytest.raises(RetrainError, match=r"reported 3 timed steps after 5 warm-up steps.*raise --steps"):
        steady_step_timing(events, 64, warmup_steps=5)


@pytest.mark.parametrize(("max_procs", "expected"), [(2, 64), (3, 66), (4, 72), (5, 120), (8, 840)])
def test_the_default_global_batch_splits_over_every_count(max_procs, expected):
    assert default_global_batch_size(max_procs) == expected
    assert MeasureSettings(max_procs=max_procs).global_batch_size == expected


def test_the_measured_width_is_the_tabular_tasks_default():
    import inspect

    from training.planning.measure import DEFAULT_HIDDEN_WIDTH
    from training.tasks.tabular.task import TabularTask

    assert inspect.signature(TabularTask).parameters["hidden_width"].default == DEFAULT_HIDDEN_WIDTH


def test_epochs_cover_the_requested_steps():
    assert epochs_for(30, 1421, 64) == 2  # 22 steps per epoch
    assert epochs_for(22, 1421, 64) == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_procs": 1}, "--max-procs must be a whole number >= 2"),
        ({"steps": 9}, "--steps must be a whole number >= 10 (the first 5 are warm-up"),
        ({"hidden_width": 0}, "--hidden-width must be a whole number >= 1"),
        ({"global_batch_size": 0}, "--global-batch-size must be a whole number >= 1"),
        (
            {"max_procs": 4, "global_batch_size": 30},
            "--global-batch-size 30 does not split evenly over 4 processes; every count 1..4 trains the "
            "same global batch, so use a multiple of 12",
        ),
    ],
)
def test_measure_settings_refuse_bad_values(fields, message):
    with pytest.raises(InputError) as caught:
        MeasureSettings(**fields)
    assert str(caught.value).startswith(message)


class ModelTimer:
    """A StepTimer whose steps follow step(N) = a/N + b·log2(N) exactly, and which records its calls."""

    def __init__(self, a: float, b: float) -> None:
        self.a, self.b = a, b
        self.calls: list[int] = []

    def time_step(self, processes: int) -> StepTiming:
        self.calls.append(processes)
        return StepTiming(self.a / processes + self.b * math.log2(processes), 25)


def test_every_count_from_one_is_timed_in_order_with_a_progress_line():
    timer, progress = ModelTimer(0.012, 0.001), io.StringIO()
    points = measure_step_times(timer, 3, progress)
    assert timer.calls == [1, 2, 3]
    assert [point.processes for point in points] == [1, 2, 3]
    assert points[1].seconds == pytest.approx(0.007)
    lines = progress.getvalue().splitlines()
    assert lines[1] == "measured 2 of 3 process counts: 7.000 ms per step (median of 25 steps)"
    assert len(lines) == 3


# -- the command line, with our timer -------------------------------------------------------------------


def run_measured(capsys, timer: ModelTimer, *argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(["plan", "scaling", "--measure", *argv])
    out = io.StringIO()
    code = planning_cli._scaling(args, out, timer=timer)
    return code, out.getvalue(), capsys.readouterr().err


def test_measured_json_carries_the_points_the_fit_and_the_plan(capsys):
    # a = 12 ms, b = 1 ms: for 360000 steps T1 = 1.2 h and k = 0.1 h per doubling.
    timer = ModelTimer(0.012, 0.001)
    code, out, err = run_measured(capsys, timer, "--max-procs", "3", "--run-steps", "360000", "--json")
    result = json.loads(out)
    assert code == 0
    assert timer.calls == [1, 2, 3]
    assert len(err.splitlines()) == 3
    assert {"measured", "fit", "rows", "recommendation"} <= set(result)
    assert [row["processes"] for row in result["measured"]] == [1, 2, 3]
    assert result["measured"][2]["fitted_step_seconds"] == pytest.approx(0.004 + math.log2(3) / 1000)
    fit = result["fit"]
    assert (fit["compute_seconds"], fit["comm_seconds_per_doubling"]) == (
        pytest.approx(0.012),
        pytest.approx(0.001),
    )
    assert (fit["single_gpu_hours"], fit["comm_hours_per_doubling"]) == (
        pytest.approx(1.2),
        pytest.approx(0.1),
    )
    assert fit["clamped"] is False
    assert [row["gpus"] for row in result["rows"]] == [1, 2, 3]  # the measured counts by default
    assert set(result["rows"][0]) == {"gpus", "wall_hours", "speedup", "efficiency", "gpu_hours"}
    # 2 processes: 0.6 + 0.1 = 0.7 h, efficiency 1.2/0.7/2 = 0.857; 3: 0.4 + 0.158 h, 0.717.
    assert result["recommendation"] == {
        "gpus": 2,
        "reason": "the largest GPU count with efficiency >= 0.80",
    }
    assert result["measurement"]["global_batch_size"] == 66


def test_measured_table_extrapolates_to_the_given_gpus_and_plots_the_points(capsys, tmp_path):
    timer, plot = ModelTimer(0.012, 0.001), tmp_path / "scaling.png"
    code, out, _ = run_measured(
        capsys, timer, "--run-steps", "360000", "--gpus", "1,2,4,8", "--plot", str(plot)
    )
    lines = out.splitlines()
    assert code == 0
    assert lines[1].split() == ["PROCS", "STEP_MS", "SPEEDUP", "EFFICIENCY", "FITTED_STEP_MS"]
    assert lines[3].split() == ["2", "7.000", "1.71", "0.857", "7.000"]
    assert lines[4] == "fit: step(N) = 12.000 ms / N + 1.000 ms x log2(N)"
    assert lines[5] == "a run of 360000 steps: --single-gpu-hours 1.2 --comm-hours-per-doubling 0.1"
    assert [line.split()[0] for line in lines[7:11]] == ["1", "2", "4", "8"]
    assert lines[-1].startswith("recommended: 2 GPUs")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", plot.read_bytes()[16:24]) == (800, 450)


def test_a_clamped_fit_says_so(capsys):
    class Superlinear(ModelTimer):
        def time_step(self, processes: int) -> StepTiming:
            self.calls.append(processes)
            return StepTiming({1: 0.010, 2: 0.004}[processes], 25)

    code, out, _ = run_measured(capsys, Superlinear(0, 0))
    assert code == 0
    assert "communication clamped to 0" in out
    assert "step(N) = 9.600 ms / N + 0.000 ms x log2(N)" in out


def plan_scaling(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", "scaling", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--max-procs", "0"), "--max-procs must be a whole number >= 2"),
        (("--max-procs", "1"), "--max-procs must be a whole number >= 2"),
        (("--max-procs", "two"), "--max-procs must be a whole number >= 1, got 'two'"),
        (("--steps", "3"), "--steps must be a whole number >= 10"),
        (("--max-procs", "4", "--global-batch-size", "30"), "--global-batch-size 30 does not split"),
        (("--hidden-width", "0"), "--hidden-width must be a whole number >= 1"),
        (("--run-steps", "0"), "--run-steps must be a whole number >= 1"),
        (("--single-gpu-hours", "5"), "--single-gpu-hours cannot be combined with --measure"),
        (("--comm-hours-per-doubling", "1"), "--comm-hours-per-doubling cannot be combined"),
        (("--gpus", "2,1"), "--gpus must be increasing"),
        (("--efficiency-threshold", "2"), "--efficiency-threshold must be a fraction"),
        (("--gpu-hour-price", "1"), "--gpu-hour-price and --value-per-hour-saved must be given"),
        (("--plot", "scaling.svg"), "--plot scaling.svg: expected a file name ending in .png"),
    ],
)
def test_bad_measure_arguments_are_refused_before_any_run(capsys, argv, message):
    timer = ModelTimer(0.012, 0.001)
    with pytest.raises(InputError) as caught:
        run_measured(capsys, timer, *argv)
    assert str(caught.value).startswith(message)
    assert timer.calls == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--measure", "--max-procs", "0"), "--max-procs must be a whole number >= 2"),
        (("--measure", "--data", "/nonexistent/prepared"), "--data /nonexistent/prepared: no such folder"),
        (("--max-procs", "2", "--single-gpu-hours", "1", "--comm-hours-per-doubling", "0", "--gpus", "1"),
         "--max-procs needs --measure"),
        (("--comm-hours-per-doubling", "0", "--gpus", "1"), "--single-gpu-hours is required"),
        (("--single-gpu-hours", "1", "--comm-hours-per-doubling", "0"), "--gpus is required, unless"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    code, out, err = plan_scaling(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"retrain: error: {message}")
    assert len(err.splitlines()) == 1


def test_data_that_is_not_prepared_or_too_small_is_refused(capsys, tmp_path, prepared_data):
    code, _, err = plan_scaling(capsys, "--measure", "--data", str(tmp_path))
    assert code == 2
    assert err.startswith(f"retrain: error: --data: {tmp_path}: no manifest.json")
    code, _, err = plan_scaling(
        capsys, "--measure", "--data", str(prepared_data), "--global-batch-size", "2000"
    )
    assert code == 2
    assert "--global-batch-size 2000 is larger than the training split" in err
    assert len(err.splitlines()) == 1


# -- the real thing -------------------------------------------------------------------------------------


def test_a_real_measurement_with_torchrun_fits_the_model(capsys):
    """`retrain plan scaling --measure --max-procs 2`: the digits sample, our trainer on 1 process and on
    2 under torchrun (gloo), a fit, and a plan. Only positivity and shape are asserted: the CPUs here are
    shared, so the step times themselves are whatever they are."""
    before = set(Path(tempfile.gettempdir()).glob("retrain-measure-*"))
    code, out, err = plan_scaling(
        capsys, "--measure", "--max-procs", "2", "--steps", "30", "--hidden-width", "32", "--json"
    )
    assert code == 0, err[-3000:]
    result = json.loads(out)
    measured = result["measured"]
    assert [row["processes"] for row in measured] == [1, 2]
    assert all(row["step_seconds"] > 0 and math.isfinite(row["step_seconds"]) for row in measured)
    assert [line for line in err.splitlines() if line.startswith("measured ")][1].startswith(
        "measured 2 of 2 process counts under ddp: "  # the default strategy, as the run's metadata says
    )
    fit = result["fit"]
    assert fit["compute_seconds"] > 0 and math.isfinite(fit["compute_seconds"])
    assert fit["comm_seconds_per_doubling"] >= 0 and math.isfinite(fit["comm_seconds_per_doubling"])
    assert fit["single_gpu_hours"] == pytest.approx(fit["compute_seconds"] * 100_000 / 3600)
    assert [row["gpus"] for row in result["rows"]] == [1, 2]
    assert all(row["wall_hours"] > 0 for row in result["rows"])
    assert result["recommendation"]["gpus"] in (1, 2)
    assert result["recommendation"]["reason"]
    assert all(row["fitted_step_seconds"] > 0 for row in measured)
    assert result["measurement"]["data"] is None  # the digits sample, prepared in a temporary folder...
    assert set(Path(tempfile.gettempdir()).glob("retrain-measure-*")) <= before  # ...that is gone


# -- the strategy measured ------------------------------------------------------------------------------


def test_the_measured_strategy_is_recorded_with_the_curve(capsys):
    for argv, strategy in (((), "ddp"), (("--strategy", "fsdp"), "fsdp")):
        code, out, _ = run_measured(capsys, ModelTimer(0.012, 0.001), *argv, "--json")
        assert code == 0
        assert json.loads(out)["measurement"]["strategy"] == strategy
    code, out, _ = run_measured(capsys, ModelTimer(0.012, 0.001), "--strategy", "fsdp")
    assert out.splitlines()[0].startswith("measured: fsdp, global batch 64, hidden width 256, ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--strategy", "zero3"), "--strategy must be one of ddp, fsdp, got 'zero3'"),
        (("--strategy", "FSDP"), "--strategy must be one of ddp, fsdp, got 'FSDP'"),
    ],
)
def test_a_strategy_the_trainer_lacks_is_refused_before_any_run(capsys, argv, message):
    timer = ModelTimer(0.012, 0.001)
    with pytest.raises(InputError) as caught:
        run_measured(capsys, timer, *argv)
    assert str(caught.value) == message
    assert timer.calls == []


def test_the_strategy_needs_measure(capsys):
    argv = ("--strategy", "fsdp", "--single-gpu-hours", "1", "--comm-hours-per-doubling", "0", "--gpus", "1")
    code, out, err = plan_scaling(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith("retrain: error: --strategy needs --measure")


@pytest.mark.parametrize(
    ("recorded", "message"),
    [
        (
            {"strategy": "ddp", "world_size": 2},
            "measuring 2 processes under fsdp: the training ran under ddp on 2",
        ),
        (
            {"strategy": "fsdp", "world_size": 1},
            "measuring 2 processes under fsdp: the training ran under fsdp on 1",
        ),
        ({"world_size": 2}, "measuring 2 processes: the training's metadata.json cannot be read"),
        (None, "measuring 2 processes: the training's metadata.json cannot be read"),
    ],
)
def test_a_timed_run_that_did_not_train_as_asked_is_refused(tmp_path, recorded, message):
    # What each run's metadata.json says it trained under is what the curve is of (TrainerStepTimer).
    if recorded is not None:
        (tmp_path / "metadata.json").write_text(json.dumps(recorded))
    with pytest.raises(RetrainError) as caught:
        _trained_under(tmp_path, 2, "fsdp")
    assert str(caught.value).startswith(message)


def test_a_real_fsdp_measurement_trains_every_count_under_fsdp(capsys, prepared_data, tmp_path, warm_starts):
    """`--strategy fsdp` reaches each timed `retrain train` (forked warm, the smallest measurement: 2
    process counts of one epoch, a width-8 model): each trains under FSDP on its process count, as its
    metadata.json and the progress lines (read from it) say."""
    measure = ("--measure", "--strategy", "fsdp", "--max-procs", "2", "--steps", "10", "--hidden-width", "8")
    args = build_parser().parse_args(["plan", "scaling", *measure, "--data", str(prepared_data), "--json"])
    settings = planning_cli._measure_settings(args)
    work = tmp_path / "work"
    timer = TrainerStepTimer(prepared_data, work, settings, os.environ, start=warm_starts.start_command())
    out = io.StringIO()
    assert planning_cli._scaling(args, out, timer=timer) == 0
    result = json.loads(out.getvalue())
    assert result["measurement"]["strategy"] == "fsdp"
    assert [row["processes"] for row in result["measured"]] == [1, 2]
    assert all(row["step_seconds"] > 0 and math.isfinite(row["step_seconds"]) for row in result["measured"])
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("measured ")]
    assert [line.split(":")[0] for line in progress] == [
        "measured 1 of 2 process counts under fsdp",
        "measured 2 of 2 process counts under fsdp",
    ]
    for processes in (1, 2):
        metadata = json.loads((work / f"nproc-{processes}" / "out" / "metadata.json").read_text())
        assert (metadata["strategy"], metadata["config"]["strategy"]) == ("fsdp", "fsdp")
        assert metadata["world_size"] == processes
