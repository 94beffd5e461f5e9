"""`retrain run`, `retrain runs` and `retrain init`: the whole pipeline on this machine, what earlier runs
did, and a new model's configuration.

    retrain run --data RAW [--model-name NAME | --config FILE] [--task REF] [--task-option KEY=VALUE ...]
                [--epochs N] [--param KEY=VALUE ...] [--nproc N] [--force-rerun]
    retrain runs [--json] [--limit N]
    retrain init NAME --task tabular|image|custom [--dir models]     (tabular: also landing/NAME/ sample data)

`run` reads the model's configuration file (models/NAME.toml, or --config; components/run_settings.py) for
its task, gate policy and parameters, checks that the task loads and reports the gate's metrics (the
preflight, components/preflight.py), pins RAW as a data version (an immutable copy under
`<state>/data/<model>/`), and runs prep -> train -> evaluate -> register with step reuse, printing each step
as it starts, is reused, ends or fails. First it prints what the same run would cost on Azure ML
(components/cost.py, from the RETRAIN_* cost settings, with the train time the model's last training here
measured when there is one: components/local/measured.py); last, the run's status with the gate's decision
beside it (registered as vN, or refused, and why) with the candidate's metrics beside the champion's, or the
step that failed and why (components/outcome.py). A step's resumes are said as it ends (`train resumed at
step 3000 after an eviction`; components/local/resumes.py).
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
from components.local.invocation import command_line, python_argv, retrain_argv, shown_path
from components.local.measured import measured_training
from components.local.model_init import KINDS, LANDING_FOLDER, init_model
from components.local.sample_table import SAMPLE_ROWS
from components.local.warm import WarmLauncher
from components.model_config import DEFAULT_MODELS_DIR, MODELS_DIR_VARIABLE, models_dir
from components.outcome import (
    decision_details,
    describe_outcome,
    read_registration,
    score_lines,
    training_line,
)
from components.preflight import Preflight, SubprocessPreflight
from components.request import CANCELED, COMPLETED, FAILED, DataRef, RunRequest
from components.run_settings import DEFAULT_MODEL_NAME, add_task_options, settings_from_arguments
from components.specs import load_pipeline_spec
from components.task_ref import raw_depth
from core.secrets import mask_secrets, mask_secrets_in
from core.warm_start import warm_start_setting

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
    """Add `run`, `runs` and `init` to a `retrain` parser's subcommands."""
    run = commands.add_parser("run", help="run the whole pipeline on this machine, reusing unchanged steps")
    run.add_argument("--data", type=Path, required=True, metavar="RAW", help="folder of the task's raw files")
    run.add_argument(
        "--model-name",
        help=f"the model (default {DEFAULT_MODEL_NAME}); reads NAME.toml in ${MODELS_DIR_VARIABLE} (default "
        f"./{DEFAULT_MODELS_DIR}); a model without that file needs --config or --task",
    )
    add_task_options(run)
    run.add_argument(
        "--epochs", type=_positive, help="training epochs (default: the file's, or pipeline.yml's)"
    )
    run.add_argument(
        "--param",
        type=_parameter,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a pipeline or component input, e.g. learning_rate=0.01 (repeatable)",
    )
    run.add_argument(
        "--nproc", type=_positive, default=1, help="training processes under torchrun (default 1)"
    )
    run.add_argument(
        "--force-rerun",
        action="store_true",
        help="run every step, even if it could be reused, and train from scratch",
    )
    run.set_defaults(handler=run_command)

    runs = commands.add_parser("runs", help="list local pipeline runs, newest first")
    runs.add_argument("--json", action="store_true", help="the run records as JSON")
    runs.add_argument("--limit", type=_positive, default=DEFAULT_RUNS_LISTED, help="how many (default 10)")
    runs.set_defaults(handler=runs_command)

    init = commands.add_parser("init", help="write a new model's commented configuration (and task file)")
    init.add_argument("name", help="the model's name: 1-40 lowercase letters, digits or '-'")
    init.add_argument(
        "--task",
        choices=KINDS,
        required=True,
        help=f"custom: also a task file to start from; tabular: also a sample table in {LANDING_FOLDER}/NAME",
    )
    init.add_argument(
        "--dir",
        type=Path,
        metavar="FOLDER",
        help=f"where to write (default: ${MODELS_DIR_VARIABLE}, else ./{DEFAULT_MODELS_DIR})",
    )
    init.set_defaults(handler=init_command)


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


def build_request(args: argparse.Namespace, preflight: Preflight | None = None) -> RunRequest:
    """Check the run (its settings, then its task and gate policy), then pin the raw folder as a data
    version and describe the run: nothing is pinned for a run that would be refused."""
    from components.data_version import require_folder, snapshot_folder

    settings = settings_from_arguments(args, _parameters(args))
    require_folder(args.data)  # before the slower preflight
    # The raw folder is read only if a per-class metric (recall_7) needs the class count it holds.
    preflight = preflight or SubprocessPreflight(environ=args.environ)
    found = preflight.check(settings, settings.where, args.data)
    manifest, folder = snapshot_folder(
        args.data,
        args.state_root / "data" / settings.model_name,
        found.raw_suffixes,  # the task's raw files: .csv batches, class folders of .png images...
        raw_depth(settings.task),
    )
    return settings.request(DataRef(manifest.version, str(folder)), processes_per_instance=args.nproc)


def run_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    cost = CostSettings.from_environ(args.environ)  # a bad setting stops before the data is pinned
    options = RunnerOptions(state_root=args.state_root, warm_start=warm_start_setting(args.environ))
    # The starter `retrain` started before its imports (retrain_cli.warm_start_ahead), when it did.
    ahead = getattr(args, "warm_starter", None)
    warm = ahead is not None and options.warm_start
    launcher = WarmLauncher(options.python, starter=ahead) if warm else None
    runner = LocalRunner(options, args.environ, out, launcher=launcher)
    pipeline = load_pipeline_spec()
    # One warm starter for the preflight and every step: its imports overlap the checks and the pinning.
    with runner.warm(pipeline):
        request = build_request(args, runner.preflight(pipeline))
        # The model's own last training here, when there is one, beats the setting's guess of its hours.
        measured = measured_training(RunStore(args.state_root / "runs"), request.model_name)
        request, estimate = with_estimate(request, cost, measured)
        print(f"on Azure ML, {estimate.summary()}; {estimate.basis}", file=out, flush=True)
        try:
            record = runner.run(request, force_rerun=args.force_rerun)
        except LocalStepFailed as failure:
            failed = {"failed_step": failure.step, "log_tail": failure.log_tail, "error": failure.headline}
            print(f"run {failure.run_id}: {describe_outcome(FAILED, failed)}", file=out)
            raise
    registration = read_registration(record.outputs)
    train = next((step for step in record.steps if step.name == "train"), None)
    trained = training_line(train.outputs.get("model")) if train is not None else None
    if trained is not None:  # how training ended, which the gate's lines below do not say
        print(trained, file=out)
    print(f"run {record.run_id}: {describe_outcome(record.status, decision_details(registration))}", file=out)
    for line in score_lines(
        registration
    ):  # what the gate weighed: the candidate's scores beside the champion's
        print(f"  {line}", file=out)
    for name, path in record.outputs.items():
        print(f"{name}: {path}", file=out)
    if record.status == CANCELED:
        return INTERRUPTED_EXIT_CODE
    return 0 if record.status == COMPLETED else 1


def init_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    cwd = Path.cwd()
    folder = args.dir if args.dir is not None else models_dir(cwd, args.environ)
    folder = folder if folder.is_absolute() else cwd / folder
    shown = str(folder.relative_to(cwd)) if folder.is_relative_to(cwd) else str(folder)
    # tabular: a sample table in landing/NAME, the folder a local landing container holds the model's
    # files in (its [trigger] prefix), where the printed run line finds it.
    landing = Path(LANDING_FOLDER, args.name)
    result = init_model(args.name, args.task, folder, shown, cwd / landing)
    print(f"wrote {result.config}", file=out)
    retrain = retrain_argv(cwd)
    # `--model-name` finds the file only in the folder `retrain run` looks in; elsewhere it is named.
    found = folder == models_dir(cwd, args.environ)
    model = ["--model-name", args.name] if found else ["--config", shown_path(result.config, cwd)]
    run = [*retrain, "run", *model, "--data", "RAW"]
    if result.task_file is not None:
        print(f"wrote {result.task_file}", file=out)
        print("try it, from this folder, on the sample data the task writes:", file=out)
        steps = [[*python_argv(cwd), f"{shown}/{result.task_file.name}", "--sample", "RAW"], run]
    elif result.sample is not None:
        print(f"wrote {result.sample} (sample data: {SAMPLE_ROWS} customers, churned or not)", file=out)
        print(
            "try it, from this folder, on that sample (then set [task.options] to your table's columns):",
            file=out,
        )
        steps = [[*retrain, "run", *model, "--data", str(landing)]]
    else:
        print("edit it for your data; to try it first, from this folder, on sample data:", file=out)
        sample = [*retrain, "sample-data", "--task", args.task, "--out", "RAW"]
        steps = [sample, run]
    for argv in steps:  # each runs as printed: this interpreter and its `retrain`, by path
        print(f"  {command_line(argv)}", file=out)
    return 0


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
        # Masked again: a record written before records were masked may still hold a secret.
        print(json.dumps(mask_secrets_in([record.to_dict() for record in records]), indent=2), file=out)
        return 0
    if not records:
        print(f"no local runs under {store.root}; `retrain run --data RAW` starts one", file=out)
        return 0
    for record in records:
        print(mask_secrets("\n".join(format_run(record))), file=out)
    return 0
