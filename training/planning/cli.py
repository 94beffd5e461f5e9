"""`retrain plan spot|interval|scaling`: the planning maths of training/planning/maths.py, from modelled
inputs or, for scaling with `--measure`, from step times measured on our own trainer
(training/planning/measure.py).

Values arrive as text and are parsed here, so a bad one is a one-line `InputError` naming its option
rather than argparse's usage dump.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, TextIO

from core.errors import InputError
from core.train_rules import STRATEGIES, STRATEGY_DDP
from training.planning.maths import (
    DEFAULT_EFFICIENCY_THRESHOLD,
    DEFAULT_RUN_STEPS,
    IntervalInputs,
    MeasuredScaling,
    ScalingInputs,
    ScalingPlan,
    SpotScenario,
    check_run_steps,
    check_scaling_options,
    checkpoint_interval,
    measured_scaling,
    parse_gpu_counts,
    scaling_plan,
    spot_estimate,
)
from training.planning.measure import (
    DEFAULT_HIDDEN_WIDTH,
    DEFAULT_MAX_PROCS,
    DEFAULT_STEPS,
    WARMUP_STEPS,
    MeasureSettings,
    StepTimer,
    measure_step_times,
    trainer_step_timer,
)
from training.planning.plot import check_plot_path, plot_scaling

# Options of `--measure` alone, as (flag, attribute); given without it they would be silently ignored.
MEASURE_OPTIONS = (
    ("--max-procs", "max_procs"),
    ("--steps", "steps"),
    ("--data", "data"),
    ("--global-batch-size", "global_batch_size"),
    ("--hidden-width", "hidden_width"),
    ("--strategy", "strategy"),
    ("--run-steps", "run_steps"),
)
MODEL_OPTIONS = (
    ("--single-gpu-hours", "single_gpu_hours"),
    ("--comm-hours-per-doubling", "comm_hours_per_doubling"),
)


def _number(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InputError(f"{flag} must be a number, got {text!r}")
    return value


def _whole(text: str, flag: str) -> int:
    if not (text.strip().isascii() and text.strip().isdigit()):
        raise InputError(f"{flag} must be a whole number >= 1, got {text!r}")
    return int(text)


def _whole_or(text: str | None, flag: str, default: int | None) -> int | None:
    return default if text is None else _whole(text, flag)


def _hours(value: float) -> str:
    # A measured reference run can be a fraction of an hour; two decimals would round it away.
    return f"{value:.2f}" if value >= 1 else f"{value:.3g}"


def _print_table(table: list[tuple[str, ...]], stream: TextIO) -> None:
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)), file=stream)


def _print_pairs(pairs: list[tuple[str, str]], stream: TextIO) -> None:
    width = max(len(label) for label, _ in pairs)
    for label, value in pairs:
        print(f"{label.ljust(width)}  {value}", file=stream)


def _emit_json(result: object, stream: TextIO) -> None:
    print(json.dumps(dataclasses.asdict(result), indent=2, sort_keys=True), file=stream)


def _spot(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    stream = stream or sys.stdout
    scenario = SpotScenario(
        gpus=_whole(args.gpus, "--gpus"),
        hours=_number(args.hours, "--hours"),
        evictions=_number(args.evictions, "--evictions"),
        discount=_number(args.discount, "--discount"),
        checkpoint_every=_number(args.checkpoint_every, "--checkpoint-every"),
        restart_overhead=_number(args.restart_overhead, "--restart-overhead"),
    )
    estimate = spot_estimate(scenario)
    if args.json:
        _emit_json(estimate, stream)
        return 0
    _print_pairs(
        [
            ("wall hours", f"{estimate.wall_hours:.2f}"),
            ("lost hours", f"{estimate.lost_hours:.2f}"),
            ("spot GPU-hours", f"{estimate.gpu_hours:.2f}"),
            ("dedicated GPU-hours", f"{estimate.dedicated_gpu_hours:.2f}"),
            ("cost vs dedicated", f"{estimate.cost_vs_dedicated:.3f}"),
            ("verdict", estimate.verdict),
        ],
        stream,
    )
    return 0


def _interval(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    stream = stream or sys.stdout
    inputs = IntervalInputs(
        checkpoint_seconds=_number(args.checkpoint_seconds, "--checkpoint-seconds"),
        mtbe_hours=_number(args.mtbe_hours, "--mtbe-hours"),
    )
    advice = checkpoint_interval(inputs)
    if args.json:
        _emit_json(advice, stream)
        return 0
    _print_pairs(
        [
            ("Young interval", f"{advice.young_seconds:.0f} s ({advice.young_seconds / 60:.1f} min)"),
            ("Daly interval", f"{advice.daly_seconds:.0f} s ({advice.daly_seconds / 60:.1f} min)"),
            ("overhead at Daly", f"{advice.overhead_fraction:.1%}"),
            ("lost per eviction", f"{advice.lost_seconds_per_eviction:.0f} s"),
        ],
        stream,
    )
    return 0


def _scaling(args: argparse.Namespace, stream: TextIO | None = None, timer: StepTimer | None = None) -> int:
    """`timer` replaces the real trainer runs of `--measure` (tests of the orchestration)."""
    stream = stream or sys.stdout
    if args.measure:
        return _measured_scaling(args, stream, timer)
    for flag, name in MEASURE_OPTIONS:
        if getattr(args, name) is not None:
            raise InputError(
                f"{flag} needs --measure; without it the scaling is modelled from --single-gpu-hours"
            )
    for flag, name in (*MODEL_OPTIONS, ("--gpus", "gpus")):
        if getattr(args, name) is None:
            raise InputError(f"{flag} is required, unless --measure fits the scaling from real runs")
    inputs = ScalingInputs(
        single_gpu_hours=_number(args.single_gpu_hours, "--single-gpu-hours"),
        comm_hours_per_doubling=_number(args.comm_hours_per_doubling, "--comm-hours-per-doubling"),
        gpus=parse_gpu_counts(args.gpus),
        efficiency_threshold=_number(args.efficiency_threshold, "--efficiency-threshold"),
        gpu_hour_price=_number(args.gpu_hour_price, "--gpu-hour-price"),
        value_per_hour_saved=_number(args.value_per_hour_saved, "--value-per-hour-saved"),
    )
    plan = scaling_plan(inputs)
    if args.plot is not None:
        plot_scaling(plan, args.plot, inputs.efficiency_threshold)
    if args.json:
        _emit_json(plan, stream)
        return 0
    _print_plan(plan, stream)
    return 0


def _print_plan(plan: ScalingPlan, stream: TextIO) -> None:
    table = [("GPUS", "WALL_HOURS", "SPEEDUP", "EFFICIENCY", "GPU_HOURS")]
    for row in plan.rows:
        table.append(
            (
                str(row.gpus),
                _hours(row.wall_hours),
                f"{row.speedup:.2f}",
                f"{row.efficiency:.3f}",
                _hours(row.gpu_hours),
            )
        )
    _print_table(table, stream)
    print(f"recommended: {plan.recommended_gpus} GPUs ({plan.reason})", file=stream)


def _measure_settings(args: argparse.Namespace) -> MeasureSettings:
    for flag, name in MODEL_OPTIONS:
        if getattr(args, name) is not None:
            raise InputError(
                f"{flag} cannot be combined with --measure, which fits it from the measured steps"
            )
    return MeasureSettings(
        max_procs=_whole_or(args.max_procs, "--max-procs", DEFAULT_MAX_PROCS),
        steps=_whole_or(args.steps, "--steps", DEFAULT_STEPS),
        global_batch_size=_whole_or(args.global_batch_size, "--global-batch-size", None),
        hidden_width=_whole_or(args.hidden_width, "--hidden-width", DEFAULT_HIDDEN_WIDTH),
        data=args.data,
        strategy=STRATEGY_DDP if args.strategy is None else args.strategy.strip(),
    )


def _measured_scaling(args: argparse.Namespace, stream: TextIO, timer: StepTimer | None) -> int:
    # Every option is checked before the first run: a typo must not cost a measurement.
    settings = _measure_settings(args)
    run_steps = _whole_or(args.run_steps, "--run-steps", DEFAULT_RUN_STEPS)
    gpus = parse_gpu_counts(args.gpus) if args.gpus is not None else tuple(range(1, settings.max_procs + 1))
    threshold = _number(args.efficiency_threshold, "--efficiency-threshold")
    money = (
        _number(args.gpu_hour_price, "--gpu-hour-price"),
        _number(args.value_per_hour_saved, "--value-per-hour-saved"),
    )
    check_run_steps(run_steps)
    check_scaling_options(gpus, threshold, *money)
    if args.plot is not None:
        check_plot_path(args.plot)
    timers: AbstractContextManager[StepTimer] = (
        nullcontext(timer) if timer is not None else trainer_step_timer(settings, os.environ)
    )
    with timers as active:
        points = measure_step_times(active, settings.max_procs, sys.stderr)
    result = measured_scaling(points, run_steps, gpus, threshold, *money)
    if args.plot is not None:
        measured = [(row.processes, row.efficiency) for row in result.measured]
        plot_scaling(result.plan, args.plot, threshold, measured)
    if args.json:
        print(json.dumps(_measured_json(settings, result), indent=2, sort_keys=True), file=stream)
        return 0
    _print_measured(settings, result, stream)
    _print_plan(result.plan, stream)
    return 0


def _measured_json(settings: MeasureSettings, result: MeasuredScaling) -> dict[str, Any]:
    plan = result.plan
    return {
        "measurement": {
            **dataclasses.asdict(settings),
            "data": None if settings.data is None else str(settings.data),
            "warmup_steps": WARMUP_STEPS,
        },
        "measured": [dataclasses.asdict(row) for row in result.measured],
        "fit": {
            **dataclasses.asdict(result.fit),
            "run_steps": result.run_steps,
            "single_gpu_hours": result.single_gpu_hours,
            "comm_hours_per_doubling": result.comm_hours_per_doubling,
        },
        "rows": [dataclasses.asdict(row) for row in plan.rows],
        "recommendation": {"gpus": plan.recommended_gpus, "reason": plan.reason},
    }


def _print_measured(settings: MeasureSettings, result: MeasuredScaling, stream: TextIO) -> None:
    print(
        f"measured: {settings.strategy}, global batch {settings.global_batch_size}, hidden width "
        f"{settings.hidden_width}, at least {settings.steps} steps per process count, the first "
        f"{WARMUP_STEPS} not timed",
        file=stream,
    )
    table = [("PROCS", "STEP_MS", "SPEEDUP", "EFFICIENCY", "FITTED_STEP_MS")]
    for row in result.measured:
        milliseconds = (f"{row.step_seconds * 1000:.3f}", f"{row.fitted_step_seconds * 1000:.3f}")
        table.append(
            (
                str(row.processes),
                milliseconds[0],
                f"{row.speedup:.2f}",
                f"{row.efficiency:.3f}",
                milliseconds[1],
            )
        )
    _print_table(table, stream)
    fit = result.fit
    print(
        f"fit: step(N) = {fit.compute_seconds * 1000:.3f} ms / N "
        f"+ {fit.comm_seconds_per_doubling * 1000:.3f} ms x log2(N)",
        file=stream,
    )
    if fit.clamped:
        print(
            "     communication clamped to 0: the free fit made it negative (faster than linear)", file=stream
        )
    print(
        f"a run of {result.run_steps} steps: --single-gpu-hours {result.single_gpu_hours:.3g} "
        f"--comm-hours-per-doubling {result.comm_hours_per_doubling:.3g}",
        file=stream,
    )


def add_commands(commands: argparse._SubParsersAction) -> None:
    plan = commands.add_parser("plan", help="planning maths: spot vs dedicated, checkpoint interval, scaling")
    kinds = plan.add_subparsers(dest="plan_command", required=True, metavar="PLAN")

    spot = kinds.add_parser("spot", help="does spot pay, given evictions, checkpoints and the discount")
    spot.add_argument("--gpus", required=True, metavar="G", help="GPUs the run uses (whole number >= 1)")
    spot.add_argument("--hours", required=True, metavar="H", help="hours the run needs without evictions")
    spot.add_argument("--evictions", required=True, metavar="E", help="expected evictions over the run")
    spot.add_argument("--discount", required=True, metavar="D", help="spot discount, a fraction in [0, 1)")
    spot.add_argument("--checkpoint-every", metavar="HOURS", help="hours between saves (default: no saves)")
    spot.add_argument(
        "--restart-overhead", default="0", metavar="HOURS", help="hours each restart costs (default 0)"
    )
    spot.add_argument("--json", action="store_true", help="machine-readable output")
    spot.set_defaults(handler=_spot)

    interval = kinds.add_parser("interval", help="checkpoint interval by Young's and Daly's formulas")
    interval.add_argument("--checkpoint-seconds", required=True, metavar="C", help="seconds one save takes")
    interval.add_argument("--mtbe-hours", required=True, metavar="M", help="mean hours between evictions")
    interval.add_argument("--json", action="store_true", help="machine-readable output")
    interval.set_defaults(handler=_interval)

    scaling = kinds.add_parser(
        "scaling", help="speedup and efficiency over GPU counts: modelled, or fitted to measured runs"
    )
    scaling.add_argument("--single-gpu-hours", metavar="T1", help="hours the run takes on 1 GPU")
    scaling.add_argument(
        "--comm-hours-per-doubling", metavar="K", help="hours of communication added per doubling of GPUs"
    )
    scaling.add_argument(
        "--gpus",
        metavar="N,N,...",
        help="increasing GPU counts, e.g. 1,8,16 (with --measure, default: the measured counts)",
    )
    scaling.add_argument(
        "--efficiency-threshold",
        default=str(DEFAULT_EFFICIENCY_THRESHOLD),
        metavar="FRACTION",
        help=f"least efficiency to recommend (default {DEFAULT_EFFICIENCY_THRESHOLD})",
    )
    scaling.add_argument("--gpu-hour-price", metavar="P", help="price of one GPU-hour")
    scaling.add_argument(
        "--value-per-hour-saved", metavar="V", help="value of finishing one wall hour sooner (same currency)"
    )
    scaling.add_argument("--json", action="store_true", help="machine-readable output")
    scaling.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="draw efficiency and GPU-hours vs GPUs"
    )
    measure = scaling.add_argument_group("measured (--measure): fit T1 and K to real runs of our trainer")
    measure.add_argument(
        "--measure", action="store_true", help="time `retrain train --nproc N` for N = 1..P and fit the model"
    )
    measure.add_argument(
        "--max-procs", metavar="P", help=f"largest process count to run (default {DEFAULT_MAX_PROCS})"
    )
    measure.add_argument(
        "--steps", metavar="S", help=f"least training steps per process count (default {DEFAULT_STEPS})"
    )
    measure.add_argument(
        "--data", type=Path, metavar="DIR", help="a prepared data version (default: the digits sample)"
    )
    measure.add_argument(
        "--global-batch-size",
        metavar="B",
        help="samples per step for every process count (default: 64 rounded up to split over 1..P)",
    )
    measure.add_argument(
        "--hidden-width", metavar="W", help=f"the model's hidden width (default {DEFAULT_HIDDEN_WIDTH})"
    )
    measure.add_argument(
        "--strategy",
        metavar="|".join(STRATEGIES),
        help=f"how the processes share the model, as `retrain train --strategy` (default {STRATEGY_DDP})",
    )
    measure.add_argument(
        "--run-steps",
        metavar="R",
        help=f"steps of the run to plan, turning step times into hours (default {DEFAULT_RUN_STEPS})",
    )
    scaling.set_defaults(handler=_scaling)
