"""The `retrain` command: the one place that knows every room and puts their subcommands side by side.

`training.cli` contributes the commands that run inside a step (sample-data, prepare, train, evaluate,
register, drift), those that read the model registry (models, lineage, rollback, serve) and the planner
(plan); `components.cli_local` the local pipeline runner (run, runs); `components.cli_azure` the Azure ML side
(submit, publish, schedule); `function_app.local.cli` the front door played locally (event, watch, trigger,
flush, ledger); `demo.cli` the whole loop on one machine (demo). Each handler gets the local state folder
and the environment on its arguments, so no library code reads os.environ.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from components import cli_azure, cli_local
from core.errors import RetrainError
from core.secrets import mask_logged_secrets, mask_secrets
from demo import cli as demo_cli
from function_app.local import cli as front_door_cli
from training import cli as training_cli
from training.local_state import state_root


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retrain", description=training_cli.__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    training_cli.register_commands(commands)
    cli_local.register_commands(commands)
    cli_azure.register_commands(commands)
    front_door_cli.register_commands(commands)
    demo_cli.register_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    training_cli.quiet_library_output(os.environ)
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    mask_logged_secrets()
    # azure-ai-ml announces its own experimental schema classes while loading any job; nothing to act on.
    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)
    # One INFO line per storage request would bury the decisions the commands print.
    logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)
    args.environ = dict(os.environ)
    args.state_root = state_root(args.environ, Path.cwd())
    try:
        return args.handler(args)
    except RetrainError as error:  # PipelineError and the front door's errors included
        print(f"retrain: error: {mask_secrets(str(error))}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
