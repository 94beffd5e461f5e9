"""`retrain check-model`: the pipeline's preflight, in the training environment, before any step runs.

It loads the task (a task that fails to load, or lacks a part of the contract, is one line naming the
task and what is missing) and checks the gate policy's metric names against the metrics the task
declares, so that a typo in a model's configuration is refused before a whole training, not after it.
The policy is built as the register step builds it (policy_of: the parts left unset take the task's
defaults). A member of a per-class family (`recall_7`) is checked against the task's class count too:
the one its options fix, else, with `--raw`, the one its raw data holds (the task's `class_count`), so a
class the model will never have is refused before anything trains. On success it prints one JSON line:
the task's name, its raw file suffixes (what the front door routes for a user's task), its metrics, which
of them are per-class families, the class count when known, and the primary metric the gate will compare.

components/preflight.py runs it as `python -m training.cli check-model ...` (components/ imports no
torch); the flags are the register step's, so what the preflight accepts, the register step reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from core.errors import InputError

if TYPE_CHECKING:
    from training.gate.policy import GatePolicy
    from training.tasks.base import Task

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
    raw: Path | None = None,
) -> dict[str, Any]:
    """Load the task and check the given parts of the policy against its metrics, with the class count its
    options fix or, given `raw`, its raw data holds; what was found."""
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
    count = checked_class_count(task, policy, raw, f"{where} (task {task_ref!r})")
    return {
        "task": task_ref,
        "name": task.name,
        "raw_suffixes": list(task.raw_suffixes),
        "metrics": {metric.name: metric.direction for metric in task.metrics.metrics},
        "per_class": [metric.name for metric in task.metrics.metrics if metric.per_class],
        "class_count": count,
        "primary_metric": policy.primary_metric,
    }


def checked_class_count(task: Task, policy: GatePolicy, raw: Path | None, where: str) -> int | None:
    """The task's class count, the one its options fix, else (given `raw`) the one its raw data holds, and
    the policy checked against it: a member beyond the classes (`recall_12` of 10) is one the candidate
    can never report. None when it is not known (the policy's family members then pass, as before)."""
    from training.gate.policy import validate_policy_metrics
    from training.tasks.base import class_count_of

    count = class_count_of(task, None)
    if count is None and raw is not None:
        count = class_count_of(task, raw)
    if count is not None:
        validate_policy_metrics(policy, task.metrics.with_class_count(count), where)
    return count


def names_a_class_member(task: Task, policy: GatePolicy) -> bool:
    """Whether the policy names one member of a per-class family (`recall_7`): only then does its check
    need the class count, which may mean reading the raw data."""
    named = (policy.primary_metric, *policy.floors, *policy.max_regression, *policy.first_model_floors)
    return any(task.metrics.per_class_member(name) is not None for name in named)


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
        args.raw,
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
    check.add_argument(
        "--raw",
        type=Path,
        metavar="FOLDER",
        help="the run's raw data: the class count a per-class metric (recall_7) is checked against, when "
        "the task's options do not fix it",
    )
    check.set_defaults(handler=_check_model_command)
