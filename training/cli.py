"""The `retrain` command line: one subcommand per job, each a thin parse-and-delegate wrapper."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path

from core.errors import InputError, RetrainError
from core.flags import add_flags, config_from_namespace
from core.secrets import mask_logged_secrets, mask_secrets, mlflow_credentials_apart
from training.data.prepare_config import PrepareConfig
from training.drift import cli as drift_cli
from training.engine.train_args import add_train_arguments
from training.gate import check_model
from training.gate import cli as registry_cli
from training.local_state import state_root
from training.planning import cli as planning_cli
from training.tasks.task_flags import TASK_OPTION_HELP, add_task_option_flag, task_options_from_args

log = logging.getLogger("retrain")


def _sample_data(args: argparse.Namespace) -> int:
    if args.task == "image":
        from training.tasks.image.sample_data import write_sample_images

        if args.label_noise or args.format != "csv":
            raise InputError("--label-noise and --format are for --task tabular; images are PNG files")
        images = write_sample_images(args.out, per_class=args.per_class, seed=args.seed, shift=args.shift)
        log.info("wrote %d images in class folders to %s", len(images), args.out)
        return 0
    from training.tasks.tabular.sample_data import write_sample_batches

    paths = write_sample_batches(
        args.out,
        batches=args.batches,
        file_format=args.format,
        label_noise=args.label_noise,
        shift=args.shift,
    )
    log.info("wrote %d raw batch files to %s", len(paths), args.out)
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from core.pinned_store import version_folder
    from core.rejected_inputs import names, write_report
    from training.data.rejection import prepare_fitting
    from training.data.splits import SplitFractions
    from training.gate.check_model import checked_class_count, names_a_class_member
    from training.gate.policy import policy_of
    from training.tasks.loader import load_task

    config = config_from_namespace(PrepareConfig, args, task_options=task_options_from_args(args))
    split = SplitFractions.parse(config.split)
    task = load_task(config.task, config.task_options)
    # The pipeline's first step checks the gate policy before any data is prepared: on Azure ML no
    # preflight runs before the job, and a metric the task does not report would otherwise fail register
    # after a whole training.
    where = f"the gate policy (task {config.task!r})"
    policy = policy_of(task, **config.policy.given(), where=where)
    # A blob data version pinned in its model's object store is read as a folder of links to its objects.
    with version_folder(config.raw, config.raw_version) as raw_folder:
        if names_a_class_member(task, policy):  # recall_7: a class the data may not have
            checked_class_count(task, policy, raw_folder, where)
        # A raw file that does not fit costs that file: the task prepares the others
        # (training/data/rejection.py).
        version, rejected = prepare_fitting(
            lambda raw: task.prepare(raw, config.out, previous=config.previous, split=split), raw_folder
        )
    if not isinstance(version, str) or not version.strip() or not config.out.is_dir():
        # The step's output would be cached as a data version that is not one: the step fails instead.
        raise InputError(
            f"--task {config.task!r}: prepare returned {version!r} and left {config.out} "
            f"{'a folder' if config.out.is_dir() else 'absent'}; expected the data version it wrote "
            "into that folder (text, e.g. 'dv-0123456789abcdef')"
        )
    if config.rejected is not None:  # written whether or not a file was left out: none is news too
        write_report(config.rejected, rejected)
    if rejected:
        log.warning(
            "prepared data version %s in %s without %d raw file(s) that do not fit: %s",
            version, config.out, len(rejected), names(rejected),
        )  # fmt: skip
    else:
        log.info("prepared data version %s in %s", version, config.out)
    return 0


def _train(args: argparse.Namespace) -> int:
    from training.engine.launch import launch
    from training.engine.train_args import config_from_args

    config = config_from_args(args, os.environ, Path.cwd())
    return launch(config, args.nproc, os.environ)


def register_commands(commands: argparse._SubParsersAction) -> None:
    """Add the training room's subcommands to a `retrain` parser."""
    sample = commands.add_parser(
        "sample-data",
        help="write sample raw data: the bundled digits as CSV batches, or shapes as PNG images",
    )
    sample.add_argument(
        "--task",
        choices=("tabular", "image"),
        default="tabular",
        help="tabular: the digits as batch files; image: circles, crosses, squares and triangles as PNGs "
        "in class folders (RAW/<class>/<file>.png)",
    )
    sample.add_argument("--out", type=Path, required=True, help="folder for the raw files")
    sample.add_argument("--batches", type=int, default=4, help="number of batch files (default 4)")
    sample.add_argument("--format", choices=("csv", "parquet"), default="csv", help="file format")
    sample.add_argument(
        "--label-noise",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="relabel this fraction of rows to another class: a deliberately degraded data set",
    )
    sample.add_argument(
        "--shift",
        type=float,
        default=0.0,
        metavar="STRENGTH",
        help="move the images right by 2*STRENGTH columns and brighten them by 1+STRENGTH, rounded "
        "(STRENGTH 0 to 1; for --task image: brighter, shapes further right and down): deliberately "
        "drifted data for `retrain drift`",
    )
    sample.add_argument("--per-class", type=int, default=100, help="--task image: images per class (100)")
    sample.add_argument(
        "--seed", type=int, default=0, help="--task image: what to draw; another seed adds new files (0)"
    )
    sample.set_defaults(handler=_sample_data)

    prep = commands.add_parser("prepare", help="validate, dedupe and split raw files into a data version")
    add_flags(prep, PrepareConfig)
    add_task_option_flag(prep, TASK_OPTION_HELP)
    prep.set_defaults(handler=_prepare)

    train = commands.add_parser("train", help="train with checkpoint/resume, on one or more processes")
    train.add_argument("--nproc", type=int, default=1, help="data-parallel processes (torchrun when > 1)")
    add_train_arguments(train)
    train.set_defaults(handler=_train)

    registry_cli.add_commands(commands)
    drift_cli.add_commands(commands)
    planning_cli.add_commands(commands)
    check_model.add_commands(commands)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retrain", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    register_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def quiet_library_output(environ: MutableMapping[str, str]) -> None:
    """Progress bars belong on a terminal, not in step logs: MLflow draws one per artifact download."""
    environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def keep_mlflow_credentials_apart(args: argparse.Namespace, environ: MutableMapping[str, str]) -> None:
    """MLflow is given no URI with user info, neither the environment's nor the command's own
    `--mlflow-tracking-uri` (core.secrets.mlflow_credentials_apart): it prints the URI it has."""
    uri = getattr(args, "mlflow_tracking_uri", None)
    uri = mlflow_credentials_apart(environ, uri if isinstance(uri, str) else None)
    if hasattr(args, "mlflow_tracking_uri"):
        args.mlflow_tracking_uri = uri


def main(argv: Sequence[str] | None = None) -> int:
    quiet_library_output(os.environ)
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    mask_logged_secrets()
    try:
        keep_mlflow_credentials_apart(args, os.environ)
        args.environ = dict(os.environ)
        args.state_root = state_root(args.environ, Path.cwd())
        return args.handler(args)
    except RetrainError as error:
        print(f"retrain: error: {mask_secrets(str(error))}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
