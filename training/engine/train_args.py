"""Command-line options of the trainer, shared by `retrain train` and the torchrun worker module.

The flags are TrainConfig's fields (training/engine/config.py, core/flags.py); this module adds what only a
command line has: `--task-option KEY=VALUE` over `--task-options`, `--no-mlflow`, and the defaults taken from
the environment and the working folder (the tracking store, absolute paths). `retrain train` validates them
into a `TrainConfig` before starting any process, then hands the workers the same config as explicit flags
(core.flags.config_to_argv), so what a worker runs is visible in the process list and reproducible by hand
with `torchrun ... -m training.engine.worker <flags>`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from core.errors import InputError
from core.flags import add_flags, config_from_namespace
from training.engine.config import FLAG_GROUPS, TrainConfig, off_or_text
from training.local_state import (
    artifacts_beside,
    default_mlflow_artifact_location,
    default_mlflow_tracking_uri,
    state_root,
)
from training.tasks.task_flags import TASK_OPTION_HELP, add_task_option_flag, task_options_from_args


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    for title in FLAG_GROUPS:
        parser.add_argument_group(title)
    add_flags(parser, TrainConfig)
    groups = {group.title: group for group in parser._action_groups}
    add_task_option_flag(groups["task"], TASK_OPTION_HELP)
    groups["reporting"].add_argument(
        "--no-mlflow", action="store_true", help="do not track the run in MLflow"
    )


def _tracking(
    args: argparse.Namespace, environ: Mapping[str, str], cwd: Path
) -> tuple[str | None, str | None]:
    if args.no_mlflow or (args.mlflow_tracking_uri or "").lower() == "off":
        return None, None
    if args.mlflow_tracking_uri:
        uri = args.mlflow_tracking_uri
        given = args.mlflow_artifact_location
        return uri, off_or_text(given) if given else artifacts_beside(uri)
    if environ.get("MLFLOW_TRACKING_URI"):
        return environ["MLFLOW_TRACKING_URI"], off_or_text(args.mlflow_artifact_location)
    root = state_root(environ, cwd)
    root.mkdir(parents=True, exist_ok=True)
    return default_mlflow_tracking_uri(root), default_mlflow_artifact_location(root)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str], cwd: Path) -> TrainConfig:
    if not args.data.is_dir():
        raise InputError(f"--data {args.data}: no such folder; expected a prepared data version")
    tracking_uri, artifact_location = _tracking(args, environ, cwd)
    return config_from_namespace(
        TrainConfig,
        args,
        data=args.data.resolve(),
        out=args.out.resolve(),
        checkpoints=args.checkpoints if "://" in args.checkpoints else str(Path(args.checkpoints).resolve()),
        task_options=task_options_from_args(args),
        mlflow_tracking_uri=tracking_uri,
        mlflow_artifact_location=artifact_location,
    )
