"""The `retrain` command: the one place that knows every room and puts their subcommands side by side.

`training.cli` contributes the commands that run inside a step (sample-data, prepare, train, evaluate,
register, drift), those that read the model registry (models, lineage, rollback, serve) and the planner
(plan); `components.local.cli` the local pipeline runner (run, runs, init); `components.azureml.cli` the
Azure ML side (submit, publish, schedule); `function_app.local.cli` the front door played locally (event,
watch, trigger, flush, ledger); `demo.cli` the whole loop on one machine (demo). One command is this file's
own, since it asks every room: `gc`, which removes the pinned data nothing needs any more
(components/local/retention.py) and must hear from the front door's ledger, the local runs and the registry
what they still use. Each handler gets the local state folder and the environment on its arguments, so no
library code reads os.environ.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import RetrainError
from core.secrets import mask_logged_secrets, mask_secrets
from core.warm_start import warm_start_setting
from training.local_state import state_root

if TYPE_CHECKING:
    from components.local.starter import StarterProcess

# The rooms' commands are imported in build_parser, after `retrain run` has started its warm starter.
RUN_COMMAND = "run"


def build_parser() -> argparse.ArgumentParser:
    from components.azureml import cli as azureml_cli
    from components.local import cli as local_cli
    from demo import cli as demo_cli
    from function_app.local import cli as front_door_cli
    from training import cli as training_cli

    parser = argparse.ArgumentParser(prog="retrain", description=training_cli.__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    training_cli.register_commands(commands)
    local_cli.register_commands(commands)
    azureml_cli.register_commands(commands)
    front_door_cli.register_commands(commands)
    demo_cli.register_commands(commands)
    _register_gc(commands)
    return parser


def _register_gc(commands: argparse._SubParsersAction) -> None:
    from components.local.retention import DEFAULT_KEEP

    gc = commands.add_parser(
        "gc",
        help="remove the pinned data versions nothing needs any more, and the bytes only they held",
        description="Keeps each model's newest pins, the data of the front door's unfinished submissions "
        "and of each model's last finished one, of the local runs in progress, and of every registered "
        "model version; removes the other pinned versions, then every stored file no version holds.",
    )
    gc.add_argument(
        "--keep", type=int, default=DEFAULT_KEEP, help=f"newest pins kept per model (default {DEFAULT_KEEP})"
    )
    gc.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    gc.set_defaults(handler=_gc)


def _gc(args: argparse.Namespace) -> int:
    from components.local.retention import collect, pinned_versions
    from components.local.runs import IN_PROGRESS, RunStore
    from core.versions import is_raw_version
    from function_app.local.cli import open_configured_ledger
    from training.gate.lineage import RAW_DATA_VERSION, tag
    from training.gate.registry import ModelRegistry, resolve_store

    data_root = args.state_root / "data"
    in_use: dict[str, dict[str, str]] = open_configured_ledger(args.environ).raw_versions_in_use()
    for run in RunStore(args.state_root / "runs").list():
        if run.status in IN_PROGRESS and is_raw_version(run.data_version):
            in_use.setdefault(run.model_name, {})[run.data_version] = f"run {run.run_id} is {run.status}"
    registry = ModelRegistry(resolve_store(None, args.environ, args.state_root))
    for model_name in sorted({pinned.model_name for pinned in pinned_versions(data_root)}):
        for info in registry.versions(model_name):
            version = tag(info.tags, RAW_DATA_VERSION)
            if version is not None:
                in_use.setdefault(model_name, {}).setdefault(
                    version, f"registered as {model_name} v{info.version}"
                )
    done = collect(data_root, in_use, args.keep, args.dry_run)
    for pinned, why in done.kept:
        print(f"kept     {pinned.describe()}: {why}")
    for pinned in done.removed:
        print(f"{'would remove' if args.dry_run else 'removed '} {pinned.describe()}")
    freed = done.objects
    verb = "would free" if args.dry_run else "freed"
    print(f"{verb} {freed.objects} stored file(s), {freed.bytes:,} bytes, in {data_root}")
    return 0


@contextlib.contextmanager
def warm_start_ahead(argv: Sequence[str], environ: Mapping[str, str]) -> Iterator[StarterProcess | None]:
    """For `retrain run`, its warm starter (components/local/warm.py), started before this process
    imports the rooms (0.5 s): the run's steps wait mostly on the starter's own imports of torch and
    MLflow, so these overlap them. Ended when the block ends, if the run has not ended it already. None
    for any other command, with warm starts off (or a setting the run itself will refuse), or when it
    cannot be started: the runner then starts its own, or none."""
    command = next((word for word in argv if not word.startswith("-")), None)
    starter = None
    if command == RUN_COMMAND:
        from components.local.starter import StarterProcess
        from components.specs import REPO_ROOT  # the default pipeline's steps' code folder

        with contextlib.suppress(RetrainError, OSError):
            if warm_start_setting(environ):
                starter = StarterProcess.start(sys.executable, REPO_ROOT, environ)
    try:
        yield starter
    finally:
        if starter is not None:
            starter.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with warm_start_ahead(argv, os.environ) as starter:
        from training import cli as training_cli

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
        args.warm_starter = starter  # `retrain run`'s, for its runner to use and end
        try:
            training_cli.keep_mlflow_credentials_apart(args, os.environ)
            args.environ = dict(os.environ)
            args.state_root = state_root(args.environ, Path.cwd())
            return args.handler(args)
        except RetrainError as error:  # PipelineError and the front door's errors included
            print(f"retrain: error: {mask_secrets(str(error))}", file=sys.stderr)
            return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
