"""Command-line options of the trainer, shared by `retrain train` and the torchrun worker module.

`retrain train` validates them into a `TrainConfig` before starting any process, then hands the workers
the same config as explicit flags (`config_to_argv`), so what a worker runs is visible in the process list
and reproducible by hand with `torchrun ... -m training.engine.worker <flags>`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

from core.errors import InputError
from core.task_ref import options_text
from core.train_rules import read_interval
from training.engine.config import AUTO_INTERVAL, PROGRESS_MODES, TrainConfig
from training.local_state import (
    artifacts_beside,
    default_mlflow_artifact_location,
    default_mlflow_tracking_uri,
    state_root,
)

_DEFAULTS = {field.name: field.default for field in fields(TrainConfig)}


def _optional_number(kind: type):
    def parse(text: str):
        if text.lower() in ("off", "none"):
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__} or 'off', got {text!r}") from None

    return parse


def _seconds_auto_or_off(text: str) -> float | str | None:
    try:
        return read_interval(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, '{AUTO_INTERVAL}' or 'off', got {text!r}"
        ) from None


def add_task_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--task`, `--task-options JSON` and the repeatable `--task-option KEY=VALUE` (merged over it)."""
    parser.add_argument(
        "--task",
        default=_DEFAULTS["task"],
        metavar="REF",
        help="the model's task: tabular, image, path/to/file.py:Attr or package.module:Attr "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--task-options",
        metavar="JSON",
        help='the task\'s options as a JSON object, e.g. \'{"label_column": "species"}\'',
    )
    parser.add_argument(
        "--task-option",
        action="append",
        metavar="KEY=VALUE",
        help="one task option (repeatable; VALUE is JSON when it parses, else text), over --task-options",
    )


def task_options_from_args(args: argparse.Namespace) -> dict:
    """The task options of `add_task_arguments`' flags: --task-option pairs merged over --task-options."""
    # Imported here: the loader imports torch, which `retrain` must not pay for at start-up.
    from training.tasks.loader import options_from_json, parse_task_options

    return {**options_from_json(args.task_options), **parse_task_options(args.task_option)}


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    add_task_arguments(parser.add_argument_group("task"))
    data = parser.add_argument_group("data and outputs")
    data.add_argument("--data", type=Path, required=True, help="a prepared data version (retrain prepare)")
    data.add_argument("--out", type=Path, required=True, help="folder for model.pt and metadata.json")
    data.add_argument(
        "--checkpoints",
        required=True,
        help="checkpoint folder, or https://<account>.blob.core.windows.net/<container>/<prefix>",
    )

    run = parser.add_argument_group("training")
    run.add_argument("--epochs", type=int, default=_DEFAULTS["epochs"])
    run.add_argument("--seed", type=int, default=_DEFAULTS["seed"])
    run.add_argument(
        "--global-batch-size",
        type=int,
        default=_DEFAULTS["global_batch_size"],
        help="samples per step over all processes (kept when the world size changes)",
    )
    run.add_argument("--learning-rate", type=float, default=_DEFAULTS["learning_rate"])
    run.add_argument("--weight-decay", type=float, default=_DEFAULTS["weight_decay"])
    run.add_argument("--warmup-steps", type=int, default=_DEFAULTS["warmup_steps"])
    run.add_argument("--deterministic", action="store_true", help="use deterministic algorithms only")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default=_DEFAULTS["device"])

    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument(
        "--checkpoint-every-steps",
        type=_optional_number(int),
        default=_DEFAULTS["checkpoint_every_steps"],
        help="save every K steps ('off')",
    )
    ckpt.add_argument(
        "--checkpoint-every-seconds",
        type=_seconds_auto_or_off,
        default=_DEFAULTS["checkpoint_every_seconds"],
        help="save every T seconds; 'auto' measures the checkpoint cost at the first saves and takes "
        "Daly's optimum for it and --mtbe-hours; 'off'",
    )
    ckpt.add_argument(
        "--mtbe-hours",
        type=float,
        default=_DEFAULTS["mtbe_hours"],
        metavar="M",
        help="mean hours between evictions of the job (a node's / the node count), for "
        "--checkpoint-every-seconds auto (default %(default)s)",
    )
    ckpt.add_argument("--keep-checkpoints", type=int, default=_DEFAULTS["keep_checkpoints"])
    ckpt.add_argument(
        "--allow-data-change", action="store_true", help="resume a checkpoint made on another data version"
    )

    report = parser.add_argument_group("reporting")
    report.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default=_DEFAULTS["progress"],
        help="bar (terminal), log (job logs), jsonl (machine-readable, stdout), none",
    )
    report.add_argument(
        "--mlflow-tracking-uri",
        help="MLflow store, or 'off' (default: $MLFLOW_TRACKING_URI, else SQLite in the state folder)",
    )
    report.add_argument("--no-mlflow", action="store_true", help="do not track the run in MLflow")
    report.add_argument("--mlflow-experiment", default=_DEFAULTS["mlflow_experiment"])
    report.add_argument("--mlflow-artifact-location", help=argparse.SUPPRESS)


def _tracking(
    args: argparse.Namespace, environ: Mapping[str, str], cwd: Path
) -> tuple[str | None, str | None]:
    if args.no_mlflow or (args.mlflow_tracking_uri or "").lower() == "off":
        return None, None
    if args.mlflow_tracking_uri:
        uri = args.mlflow_tracking_uri
        return uri, args.mlflow_artifact_location or artifacts_beside(uri)
    if environ.get("MLFLOW_TRACKING_URI"):
        return environ["MLFLOW_TRACKING_URI"], args.mlflow_artifact_location
    root = state_root(environ, cwd)
    root.mkdir(parents=True, exist_ok=True)
    return default_mlflow_tracking_uri(root), default_mlflow_artifact_location(root)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str], cwd: Path) -> TrainConfig:
    if not args.data.is_dir():
        raise InputError(f"--data {args.data}: no such folder; expected a prepared data version")
    tracking_uri, artifact_location = _tracking(args, environ, cwd)
    return TrainConfig(
        data=args.data.resolve(),
        out=args.out.resolve(),
        checkpoints=args.checkpoints if "://" in args.checkpoints else str(Path(args.checkpoints).resolve()),
        epochs=args.epochs,
        seed=args.seed,
        global_batch_size=args.global_batch_size,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        task=args.task,
        task_options=task_options_from_args(args),
        checkpoint_every_steps=args.checkpoint_every_steps,
        checkpoint_every_seconds=args.checkpoint_every_seconds,
        mtbe_hours=args.mtbe_hours,
        keep_checkpoints=args.keep_checkpoints,
        deterministic=args.deterministic,
        allow_data_change=args.allow_data_change,
        device=args.device,
        progress=args.progress,
        mlflow_tracking_uri=tracking_uri,
        mlflow_experiment=args.mlflow_experiment,
        mlflow_artifact_location=artifact_location,
    )


def _number_or_off(value: float | str | None) -> str:
    if value is None:
        return "off"
    return value if value == AUTO_INTERVAL else repr(value)


def config_to_argv(config: TrainConfig) -> list[str]:
    """Flags that make `config_from_args` rebuild `config` exactly."""
    argv = [
        "--data",
        str(config.data),
        "--out",
        str(config.out),
        "--checkpoints",
        config.checkpoints,
        "--epochs",
        str(config.epochs),
        "--seed",
        str(config.seed),
        "--global-batch-size",
        str(config.global_batch_size),
        "--learning-rate",
        repr(config.learning_rate),
        "--weight-decay",
        repr(config.weight_decay),
        "--warmup-steps",
        str(config.warmup_steps),
        "--task",
        config.task,
        "--task-options",
        options_text(config.task_options),
        "--checkpoint-every-steps",
        _number_or_off(config.checkpoint_every_steps),
        "--checkpoint-every-seconds",
        _number_or_off(config.checkpoint_every_seconds),
        "--mtbe-hours",
        repr(config.mtbe_hours),
        "--keep-checkpoints",
        str(config.keep_checkpoints),
        "--device",
        config.device,
        "--progress",
        config.progress,
        "--mlflow-experiment",
        config.mlflow_experiment,
    ]
    if config.deterministic:
        argv.append("--deterministic")
    if config.allow_data_change:
        argv.append("--allow-data-change")
    if config.mlflow_tracking_uri is None:
        argv.append("--no-mlflow")
    else:
        argv += ["--mlflow-tracking-uri", config.mlflow_tracking_uri]
        if config.mlflow_artifact_location:
            argv += ["--mlflow-artifact-location", config.mlflow_artifact_location]
    return argv
