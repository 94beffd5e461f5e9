"""`retrain plan spot|interval|scaling`: the planning maths of training/planning.py, modelled inputs only.

Values arrive as text and are parsed here, so a bad one is a one-line `InputError` naming its option
rather than argparse's usage dump.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import TextIO

from training.errors import InputError
from training.planning import (
    DEFAULT_EFFICIENCY_THRESHOLD,
    IntervalInputs,
    ScalingInputs,
    SpotScenario,
    checkpoint_interval,
    parse_gpu_counts,
    scaling_plan,
    spot_estimate,
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


def _scaling(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    stream = stream or sys.stdout
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
        from training.planning_plot import plot_scaling

        plot_scaling(plan, args.plot, inputs.efficiency_threshold)
    if args.json:
        _emit_json(plan, stream)
        return 0
    table = [("GPUS", "WALL_HOURS", "SPEEDUP", "EFFICIENCY", "GPU_HOURS")]
    for row in plan.rows:
        table.append(
            (
                str(row.gpus),
                f"{row.wall_hours:.2f}",
                f"{row.speedup:.2f}",
                f"{row.efficiency:.3f}",
                f"{row.gpu_hours:.2f}",
            )
        )
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)), file=stream)
    print(f"recommended: {plan.recommended_gpus} GPUs ({plan.reason})", file=stream)
    return 0


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

    scaling = kinds.add_parser("scaling", help="modelled speedup and efficiency over GPU counts")
    scaling.add_argument(
        "--single-gpu-hours", required=True, metavar="T1", help="hours the run takes on 1 GPU"
    )
    scaling.add_argument(
        "--comm-hours-per-doubling",
        required=True,
        metavar="K",
        help="hours of communication added per doubling of GPUs",
    )
    scaling.add_argument(
        "--gpus", required=True, metavar="N,N,...", help="increasing GPU counts, e.g. 1,8,16"
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
    scaling.set_defaults(handler=_scaling)
