"""`retrain check-model`: the pipeline's preflight, in the training environment, before any step runs.

It loads the task (a task that fails to load, or lacks a part of the contract, is one line naming the
task and what is missing) and checks the gate policy's metric names against the metrics the task
declares, so that a typo in a model's configuration is refused before a whole training, not after it.
The policy is built as the register step builds it (policy_of: the parts left unset take the task's
defaults). On success it prints one JSON line: the task's name, its raw file suffixes (what the front door
routes for a user's task), its metrics and the primary metric the gate will compare.

components/preflight.py runs it as `python -m training.cli check-model ...` (components/ imports no
torch); the flags are the register step's, so what the preflight accepts, the register step reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from core.errors import InputError

_BOOLEANS = {"true": True, "false": False}


def check_model(
    task_ref: str,
    task_options: dict[str, Any],
    primary_metric: str | None = None,
    min_improvement: float | None = None,
    floors: str | None = None,
    max_regression: str | None = None,
    first_model_floors: str | None = None,
    where: str = "the gate policy",
    confidence: float | None = None,
) -> dict[str, Any]:
    """Load the task and check the given parts of the policy against its metrics; what was found."""
    from training.gate.policy import policy_of
    from training.tasks.loader import load_task

    task = load_task(task_ref, task_options)
    policy = policy_of(
        task,
        primary_metric=primary_metric,
        min_improvement=min_improvement,
        floors=floors,
        max_regression=max_regression,
        first_model_floors=first_model_floors,
        confidence=confidence,
        where=f"{where} (task {task_ref!r})",
    )
    return {
        "task": task_ref,
        "name": task.name,
        "raw_suffixes": list(task.raw_suffixes),
        "metrics": {metric.name: metric.direction for metric in task.metrics.metrics},
        "primary_metric": policy.primary_metric,
    }


def _check_model_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from training.tasks.loader import options_from_json, parse_task_options

    options = {**options_from_json(args.task_options), **parse_task_options(args.task_option)}
    if args.bootstrap_unloadable_champion is not None and args.bootstrap_unloadable_champion not in _BOOLEANS:
        raise InputError(
            f"--bootstrap-unloadable-champion {args.bootstrap_unloadable_champion!r}: expected true or false"
        )
    found = check_model(
        args.task,
        options,
        args.primary_metric,
        args.min_improvement,
        args.floors,
        args.max_regression,
        args.first_model_floors,
        args.where,
        args.confidence,
    )
    print(json.dumps(found, sort_keys=True), file=out or sys.stdout)
    return 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser(
        "check-model", help="load a task and check a gate policy against its metrics (the preflight)"
    )
    check.add_argument(
        "--task", default="tabular", help="tabular, image, file.py:Attr or package.module:Attr"
    )
    check.add_argument(
        "--task-options", default="{}", metavar="JSON", help="the task's options, a JSON object"
    )
    check.add_argument(
        "--task-option", action="append", default=[], metavar="KEY=VALUE", help="one option (repeatable)"
    )
    policy = check.add_argument_group("gate policy (unset parts take the task's defaults)")
    policy.add_argument("--primary-metric", metavar="METRIC")
    policy.add_argument("--min-improvement", type=float, metavar="NUMBER")
    policy.add_argument("--floors", metavar="METRIC=NUMBER,...")
    policy.add_argument("--max-regression", metavar="METRIC=NUMBER,...")
    policy.add_argument("--first-model-floors", metavar="METRIC=NUMBER,...")
    policy.add_argument("--bootstrap-unloadable-champion", metavar="true|false")
    policy.add_argument("--confidence", type=float, metavar="NUMBER")
    check.add_argument("--where", default="the gate policy", help="how error messages name the policy")
    check.set_defaults(handler=_check_model_command)
