"""`retrain run` and `retrain runs`: the whole pipeline on this machine, and what earlier runs did.

    retrain run --data RAW [--model-name digits] [--epochs N] [--param KEY=VALUE ...] [--nproc N]
                [--force-rerun]
    retrain runs [--json] [--limit N]

`run` pins RAW as a data version (an immutable copy under `<state>/data/<model>/`), runs prep -> train ->
evaluate -> register with step reuse, and prints each step as it starts, is reused, ends or fails. First
it prints what the same run would cost on Azure ML (components/cost.py, from the RETRAIN_* cost settings).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from components.cost import CostSettings, with_estimate
from components.errors import SubmissionError
from components.local import LocalRunner, LocalStepFailed, RunnerOptions, RunRecord, RunStore
from components.local.plan import check_parameters
from components.request import CANCELED, COMPLETED, DataRef, RunRequest
from components.specs import load_pipeline_spec

DEFAULT_MODEL_NAME = "digits"
DEFAULT_RUNS_LISTED = 10
# What a shell reports for a run stopped by Ctrl-C (128 + SIGINT); the steps saved their state.
INTERRUPTED_EXIT_CODE = 130


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _parameter(text: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (a pipeline or component input), got {text!r}")
    return key.strip(), value


def register_commands(commands: argparse._SubParsersAction) -> None:
    """Add `run` and `runs` to a `retrain` parser's subcommands."""
    run = commands.add_parser("run", help="run the whole pipeline on this machine, reusing unchanged steps")
    run.add_argument(
        "--data", type=Path, required=True, metavar="RAW", help="folder of raw .csv/.parquet files"
    )
    run.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help=f"default {DEFAULT_MODEL_NAME}")
    run.add_argument("--epochs", type=_positive, help="training epochs (default: pipeline.yml's)")
    run.add_argument(
        "--param",
        type=_parameter,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a pipeline or component input, e.g. hidden_width=64 (repeatable)",
    )
    run.add_argument(
        "--nproc", type=_positive, default=1, help="training processes under torchrun (default 1)"
    )
    run.add_argument("--force-rerun", action="store_true", help="run every step, even if it could be reused")
    run.set_defaults(handler=run_command)

    runs = commands.add_parser("runs", help="list local pipeline runs, newest first")
    runs.add_argument("--json", action="store_true", help="the run records as JSON")
    runs.add_argument("--limit", type=_positive, default=DEFAULT_RUNS_LISTED, help="how many (default 10)")
    runs.set_defaults(handler=runs_command)


def _parameters(args: argparse.Namespace) -> dict[str, object]:
    parameters: dict[str, object] = {}
    for key, value in args.param:
        if key in parameters:
            raise SubmissionError(f"--param {key}: given twice; give each input once")
        parameters[key] = value
    if args.epochs is not None:
        if "epochs" in parameters:
            raise SubmissionError("--epochs and --param epochs=...: both given; use one of them")
        parameters["epochs"] = args.epochs
    return parameters


def build_request(args: argparse.Namespace) -> RunRequest:
    """Pin the raw folder as a data version and describe the run."""
    from components.data_version import snapshot_folder

    parameters = _parameters(args)
    check_parameters(load_pipeline_spec(), parameters)  # refuse before pinning anything
    manifest, folder = snapshot_folder(args.data, args.state_root / "data" / args.model_name)
    return RunRequest(
        model_name=args.model_name,
        data=DataRef(manifest.version, str(folder)),
        parameters=parameters,
        processes_per_instance=args.nproc,
    )


def run_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    cost = CostSettings.from_environ(args.environ)  # a bad setting stops before the data is pinned
    request, estimate = with_estimate(build_request(args), cost)
    print(f"on Azure ML, {estimate.summary()}", file=out, flush=True)
    runner = LocalRunner(RunnerOptions(state_root=args.state_root), args.environ, out)
    try:
        record = runner.run(request, force_rerun=args.force_rerun)
    except LocalStepFailed as failure:
        print(f"run {failure.run_id}: Failed at step '{failure.step}'", file=out)
        raise
    print(f"run {record.run_id}: {record.status}", file=out)
    for name, path in record.outputs.items():
        print(f"{name}: {path}", file=out)
    if record.status == CANCELED:
        return INTERRUPTED_EXIT_CODE
    return 0 if record.status == COMPLETED else 1


def _describe_step_outputs(outputs: dict[str, str]) -> str:
    return "  ".join(f"{name}={path}" for name, path in outputs.items())


def format_run(record: RunRecord) -> list[str]:
    lines = [f"{record.run_id}  {record.status:<9}  {record.run_key}  created {record.created_at}"]
    if record.error:
        lines.append(f"  error: {record.error}")
    for step in record.steps:
        how = "reused" if step.reused else "ran"
        duration = f"{step.duration_s:7.1f} s" if step.duration_s is not None else "      - "
        attempts = f"  ({len(step.attempts)} attempts)" if len(step.attempts) > 1 else ""
        lines.append(
            f"  {step.name:<9} {step.status:<9} {how:<6} {duration}  "
            f"{_describe_step_outputs(dict(step.outputs))}{attempts}".rstrip()
        )
    return lines


def runs_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    store = RunStore(args.state_root / "runs")
    records = store.list(limit=args.limit)
    if args.json:
        print(json.dumps([record.to_dict() for record in records], indent=2), file=out)
        return 0
    if not records:
        print(f"no local runs under {store.root}; `retrain run --data RAW` starts one", file=out)
        return 0
    for record in records:
        print("\n".join(format_run(record)), file=out)
    return 0
