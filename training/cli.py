"""The `retrain` command line: one subcommand per job, each a thin parse-and-delegate wrapper."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from training.errors import RetrainError
from training.train_args import add_train_arguments

log = logging.getLogger("retrain")


def _sample_data(args: argparse.Namespace) -> int:
    from training.sample_data import write_sample_batches

    paths = write_sample_batches(args.out, batches=args.batches, file_format=args.format)
    log.info("wrote %d raw batch files to %s", len(paths), args.out)
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from training.prepare import prepare
    from training.schema import SplitFractions

    split = SplitFractions.parse(args.split)
    manifest = prepare(args.raw, args.out, previous=args.previous, split=split)
    log.info("prepared data version %s in %s", manifest.data_version, args.out)
    return 0


def _train(args: argparse.Namespace) -> int:
    from training.launch import launch
    from training.train_args import config_from_args

    config = config_from_args(args, os.environ, Path.cwd())
    return launch(config, args.nproc, os.environ)


def _demo(args: argparse.Namespace) -> int:
    from training.demo import run_demo
    from training.local_state import state_root

    logging.getLogger().setLevel(logging.WARNING)  # the demo narrates; library INFO lines would interrupt
    return run_demo(state_root(os.environ, Path.cwd()), sys.stdout, os.environ)


def _evaluate(args: argparse.Namespace) -> int:
    from training.evaluate import write_evaluation

    write_evaluation(args.model, args.data, args.out)
    return 0


def _register(args: argparse.Namespace) -> int:
    from training.register import write_registration

    # Azure ML names the pipeline job in the step's environment; the local runner does the same.
    pipeline_run = os.environ.get("AZUREML_ROOT_RUN_ID") or os.environ.get("RETRAIN_PIPELINE_RUN")
    write_registration(args.model, args.evaluation, args.model_name, args.trigger, pipeline_run, args.out)
    return 0


def _add_step_commands(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("evaluate", help="score a trained model on its data version's test split")
    evaluate.add_argument("--model", type=Path, required=True, help="a training's output folder")
    evaluate.add_argument("--data", type=Path, required=True, help="the prepared data version it trained on")
    evaluate.add_argument("--out", type=Path, required=True, help="folder for evaluation.json")
    evaluate.set_defaults(handler=_evaluate)

    register = commands.add_parser("register", help="record an evaluated candidate with its lineage")
    register.add_argument("--model", type=Path, required=True, help="a training's output folder")
    register.add_argument("--evaluation", type=Path, required=True, help="the evaluate step's output folder")
    register.add_argument("--model-name", required=True, help="the registered model's name")
    register.add_argument("--trigger", default="manual", help="what started the run")
    register.add_argument("--out", type=Path, required=True, help="folder for registration.json")
    register.set_defaults(handler=_register)


def register_commands(commands: argparse._SubParsersAction) -> None:
    """Add the training room's subcommands to a `retrain` parser."""
    sample = commands.add_parser("sample-data", help="write the bundled digits data set as raw batch files")
    sample.add_argument("--out", type=Path, required=True, help="folder for the raw batch files")
    sample.add_argument("--batches", type=int, default=4, help="number of batch files (default 4)")
    sample.add_argument("--format", choices=("csv", "parquet"), default="csv", help="file format")
    sample.set_defaults(handler=_sample_data)

    prep = commands.add_parser("prepare", help="validate, dedupe and split raw batches into a data version")
    prep.add_argument("--raw", type=Path, required=True, help="folder of raw batch files (.csv, .parquet)")
    prep.add_argument("--out", type=Path, required=True, help="new folder for the prepared data version")
    prep.add_argument("--previous", type=Path, help="an earlier prepared version to build on incrementally")
    prep.add_argument(
        "--split",
        default="0.8,0.1,0.1",
        metavar="TRAIN,VALIDATION,TEST",
        help="fractions of rows per split, adding up to 1 (default 0.8,0.1,0.1)",
    )
    prep.set_defaults(handler=_prepare)

    train = commands.add_parser("train", help="train with checkpoint/resume, on one or more processes")
    train.add_argument("--nproc", type=int, default=1, help="data-parallel processes (torchrun when > 1)")
    add_train_arguments(train)
    train.set_defaults(handler=_train)

    demo = commands.add_parser("demo", help="sample data -> prepare -> train, with an eviction and a resume")
    demo.set_defaults(handler=_demo)
    _add_step_commands(commands)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retrain", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    register_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.handler(args)
    except RetrainError as error:
        print(f"retrain: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
