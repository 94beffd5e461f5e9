"""The gate's commands: `evaluate` and `register` (pipeline steps), and `models`, `lineage`, `rollback`.

Handlers read the state folder and the environment from `args.state_root` and `args.environ`, which the
root command line puts there; they print only here, to the stream they are given.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from core.errors import InputError

if TYPE_CHECKING:
    from training.gate.lock import RegistryLock
    from training.gate.registry import ModelRegistry

DEFAULT_MODEL_NAME = "digits"
LOCKS_FOLDER = "locks"
PIPELINE_JOB_VARIABLES = ("AZUREML_ROOT_RUN_ID", "RETRAIN_PIPELINE_RUN")  # Azure ML's, the local runner's
# The gate pulls in torch; the parser is built for every `retrain` command, so defaults are filled in later.
_GATE_DEFAULT = "default or 'default': the task's, training/gate/policy.py task_defaults"
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")
_FAMILY_MEMBER = re.compile(r".+_\d+")  # recall_3: one of a family, left out of the listing's columns
LISTED_METRICS = 3


def _boolean(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _registry(args: argparse.Namespace) -> ModelRegistry:
    from core.names import check_model_name
    from training.gate.registry import ModelRegistry, resolve_store

    check_model_name(args.model_name, "--model-name")
    return ModelRegistry(resolve_store(args.mlflow_tracking_uri, args.environ, args.state_root))


def _lock(args: argparse.Namespace) -> RegistryLock:
    from training.gate.lock import open_registry_lock

    spec = args.lock if args.lock is not None else str(args.state_root / LOCKS_FOLDER)
    return open_registry_lock(spec, args.model_name, args.environ, args.lock_wait)


# -- handlers -------------------------------------------------------------------------------------------


def _task(args: argparse.Namespace) -> tuple[str | None, dict[str, Any] | None]:
    """--task with its options; (None, None) without --task: the task the model file records."""
    from training.tasks.loader import options_from_json, parse_task_options

    options = {**options_from_json(args.task_options), **parse_task_options(args.task_option)}
    if args.task is None:
        if options:
            raise InputError("--task-options/--task-option: give --task too, or neither (the model's own)")
        return None, None
    return args.task, options


def _evaluate(args: argparse.Namespace) -> int:
    from training.gate.evaluate import write_evaluation

    task_ref, task_options = _task(args)
    registry = _registry(args)
    write_evaluation(args.model, args.data, args.model_name, registry, args.out, task_ref, task_options)
    return 0


def policy_options(args: argparse.Namespace) -> dict[str, Any]:
    """The gate options given; the rest are the task's defaults (training.gate.policy.policy_for_task)."""
    return {
        "primary_metric": args.primary_metric,
        "min_improvement": args.min_improvement,
        "floors": args.floors,
        "max_regression": args.max_regression,
        "first_model_floors": args.first_model_floors,
        "bootstrap_unloadable_champion": args.bootstrap_unloadable_champion,
    }


def _improvement(text: str) -> float | None:
    if text.strip().lower() == "default":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'default', got {text!r}") from None


def _register(args: argparse.Namespace) -> int:
    from training.gate.lineage import Trigger
    from training.gate.register import RegisterRequest, write_registration

    task_ref, task_options = _task(args)
    pipeline_job = next(
        (args.environ[name] for name in PIPELINE_JOB_VARIABLES if args.environ.get(name)), None
    )
    request = RegisterRequest(
        model_dir=args.model,
        evaluation_dir=args.evaluation,
        data_dir=args.data,
        model_name=args.model_name,
        trigger=Trigger.parse(args.trigger),
        raw_data_version=args.raw_data_version,
        environment_version=args.environment_version,
        pipeline_job=pipeline_job,
        experiment=args.mlflow_experiment,
        gate=policy_options(args),
        task_ref=task_ref,
        task_options=task_options,
    )
    write_registration(request, _registry(args), _lock(args), args.out)
    return 0


def _models(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    from training.gate.history import model_listing

    stream = stream or sys.stdout
    listing = model_listing(_registry(args), args.model_name)
    if args.json:
        print(json.dumps(listing, indent=2, sort_keys=True), file=stream)
    else:
        _print_listing(listing, stream)
    return 0


def _lineage(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    from training.gate.history import lineage_report

    stream = stream or sys.stdout
    with tempfile.TemporaryDirectory(prefix="retrain-lineage-") as scratch:
        report = lineage_report(_registry(args), args.model_name, args.version, Path(scratch))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True), file=stream)
    else:
        _print_lineage(report, stream)
    return 0


def _rollback(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    from training.gate.history import rollback

    stream = stream or sys.stdout
    result = rollback(_registry(args), _lock(args), args.model_name, args.reason, datetime.now(UTC))
    previous = f"v{result['previous']}" if result["previous"] else "none"
    print(
        f"{args.model_name}: champion v{result['rolled_back_from']} -> v{result['champion']}; "
        f"previous: {previous}; reason: {args.reason}",
        file=stream,
    )
    return 0


# -- printing -------------------------------------------------------------------------------------------


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def listed_metrics(versions: list[dict[str, Any]]) -> list[str]:
    """The metric columns of `retrain models`: the newest version's primary metric, then the others every
    version has, leaving out family members (recall_3), at most LISTED_METRICS."""
    policy = versions[0]["lineage"]["gate"]["policy"]
    primary = policy.get("primary_metric") if isinstance(policy, dict) else None
    common = set.intersection(*(set(version["metrics"]) for version in versions))
    others = sorted(name for name in common if name != primary and not _FAMILY_MEMBER.fullmatch(name))
    return ([primary] if primary else []) + others[: LISTED_METRICS - (1 if primary else 0)]


def _print_listing(listing: dict[str, Any], stream: TextIO) -> None:
    versions = listing["versions"]
    if not versions:
        print(f"{listing['model_name']}: no registered versions", file=stream)
        return
    metric_names = listed_metrics(versions)
    header = (
        "VERSION",
        "ALIASES",
        *(name.upper() for name in metric_names),
        "DATA",
        "TRIGGER",
        "PIPELINE JOB",
        "CREATED",
    )
    rows = [header]
    for version in versions:
        metrics, lineage = version["metrics"], version["lineage"]
        trigger = lineage["trigger"]
        rows.append(
            (
                f"v{version['version']}",
                ",".join(version["aliases"]) or "-",
                *(_number(metrics.get(name)) for name in metric_names),
                f"{lineage['raw_version'] or '-'} -> {lineage['data_version'] or '-'}",
                f"{trigger['kind'] or '-'} {trigger['event_id'] or '-'}",
                lineage["pipeline_job"] or "-",
                version["created_at"],
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            file=stream,
        )


def _print_lineage(report: dict[str, Any], stream: TextIO) -> None:
    chain, manifest = report["lineage"], report["manifest"]
    gate, trigger, task = chain["gate"], chain["trigger"], chain["task"]
    aliases = f" ({', '.join(report['aliases'])})" if report["aliases"] else ""
    lines = [
        f"{report['model_name']} v{report['version']}{aliases}, registered {report['created_at']}",
        f"  gate       {'accepted' if gate['accepted'] else 'rejected'}: {'; '.join(gate['reasons'])}",
        f"  pipeline   {chain['pipeline_job']}",
        f"  trigger    kind {trigger['kind']}, event id {trigger['event_id']} ({trigger['text']})",
        f"  code       {chain['code']['source']} {chain['code']['version']}; "
        f"environment {chain['environment_version']}",
        f"  data       raw {chain['raw_version']} -> prepared {chain['data_version']}",
        f"  manifest   {manifest['location']} (sha256 {manifest['sha256']}, verified)",
    ]
    for entry in manifest["raw_files"]:
        entry = entry if isinstance(entry, dict) else {"name": str(entry)}
        rows = f"{entry['rows']} rows, " if "rows" in entry else ""
        lines.append(f"    raw file {entry.get('name')}: {rows}sha256 {entry.get('sha256', '-')}")
    for name, entry in manifest["splits"].items():
        lines.append(f"    split {name}: {entry['rows']} rows in {entry['file']}")
    if task is not None:
        options = json.dumps(task["options"], sort_keys=True)
        file_hash = f", file sha256 {task['file_sha256']}" if task["file_sha256"] else ""
        code = task.get("code_sha256")  # a module task's sources; a task file's is its file sha256
        code_hash = f", code sha256 {code}" if code and code != task["file_sha256"] else ""
        lines.append(f"  task       {task['ref']} options {options}{file_hash}{code_hash}")
    if chain["rollback"]:
        rollback_info = chain["rollback"]
        lines.append(
            f"  rolled back to v{rollback_info['to']} at {rollback_info['at']}: {rollback_info['reason']}"
        )
    print("\n".join(lines), file=stream)


# -- parsers --------------------------------------------------------------------------------------------


def _add_registry_options(parser: argparse.ArgumentParser, model_name_required: bool) -> None:
    parser.add_argument(
        "--model-name",
        required=model_name_required,
        default=None if model_name_required else DEFAULT_MODEL_NAME,
        help="the registered model's name"
        + ("" if model_name_required else f" (default {DEFAULT_MODEL_NAME})"),
    )
    parser.add_argument(
        "--mlflow-tracking-uri",
        help="MLflow tracking and registry store "
        "(default: $MLFLOW_TRACKING_URI, else SQLite in the state folder)",
    )


def _add_lock_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lock",
        help="where the registry lock lives: a folder, or https://<account>.blob.core.windows.net/<container>"
        f"[/<prefix>] for a blob lease (default: <state folder>/{LOCKS_FOLDER})",
    )
    parser.add_argument(
        "--lock-wait", type=float, default=600.0, metavar="SECONDS", help="how long to wait for the lock"
    )


def add_policy_options(parser: argparse.ArgumentParser) -> None:
    """The register step's gate policy options (`retrain prepare` takes them too, to check them first)."""
    policy = parser.add_argument_group("gate policy")
    policy.add_argument(
        "--primary-metric", metavar="METRIC", help=f"one of the task's metrics ({_GATE_DEFAULT})"
    )
    policy.add_argument(
        "--min-improvement",
        type=_improvement,
        metavar="NUMBER",
        help=f"how much the primary metric must beat the champion's by, absolute ({_GATE_DEFAULT})",
    )
    policy.add_argument(
        "--floors",
        metavar="METRIC=NUMBER,...",
        help=f"bounds for every candidate, or 'none' ({_GATE_DEFAULT})",
    )
    policy.add_argument(
        "--max-regression",
        metavar="METRIC=NUMBER,...",
        help="how much worse than the champion a metric may get; a family such as 'recall_*' covers "
        f"each member ({_GATE_DEFAULT})",
    )
    policy.add_argument(
        "--first-model-floors",
        metavar="METRIC=NUMBER,...",
        help=f"what the first model must meet ({_GATE_DEFAULT})",
    )
    policy.add_argument(
        "--bootstrap-unloadable-champion",
        type=_boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="true|false",
        help="let a candidate meeting the first-model floors replace a champion that cannot be loaded",
    )


def _add_task_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task",
        metavar="REF",
        help="the model's task: tabular, image, file.py:Attr or pkg.mod:Attr "
        "(default: the one the model file records; a different one is refused)",
    )
    parser.add_argument(
        "--task-options", metavar="JSON", help="the task's options as a JSON object (with --task)"
    )
    parser.add_argument(
        "--task-option",
        action="append",
        metavar="KEY=VALUE",
        help="one task option, over --task-options (repeatable)",
    )


def add_commands(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "evaluate", help="score a candidate and the champion on the same test split"
    )
    evaluate.add_argument("--model", type=Path, required=True, help="a training's output folder")
    evaluate.add_argument("--data", type=Path, required=True, help="the prepared data version it trained on")
    evaluate.add_argument("--out", type=Path, required=True, help="folder for evaluation.json")
    _add_task_options(evaluate)
    _add_registry_options(evaluate, model_name_required=True)
    evaluate.set_defaults(handler=_evaluate)

    register = commands.add_parser("register", help="gate an evaluated candidate; register it if it passes")
    register.add_argument("--model", type=Path, required=True, help="a training's output folder")
    register.add_argument("--evaluation", type=Path, required=True, help="the evaluate step's output folder")
    register.add_argument("--data", type=Path, required=True, help="the prepared data version it trained on")
    register.add_argument("--trigger", default="manual", help="'manual' or KEY=VALUE,... (kind, event_id)")
    register.add_argument("--raw-data-version", required=True, help="the pinned raw data version (rd-...)")
    register.add_argument("--environment-version", required=True, help="the training environment's version")
    register.add_argument("--out", type=Path, required=True, help="folder for registration.json")
    register.add_argument("--mlflow-experiment", default="retrain", help="experiment of the registering run")
    _add_task_options(register)
    _add_registry_options(register, model_name_required=True)
    _add_lock_options(register)
    add_policy_options(register)
    register.set_defaults(handler=_register)

    models = commands.add_parser("models", help="registered versions with aliases, metrics and lineage")
    models.add_argument("--json", action="store_true", help="machine-readable output")
    _add_registry_options(models, model_name_required=False)
    models.set_defaults(handler=_models)

    lineage = commands.add_parser(
        "lineage", help="from a model version back to its trigger and data manifest"
    )
    lineage.add_argument("version", help="the version number (e.g. 3)")
    lineage.add_argument("--json", action="store_true", help="machine-readable output")
    _add_registry_options(lineage, model_name_required=False)
    lineage.set_defaults(handler=_lineage)

    rollback_command = commands.add_parser("rollback", help="move 'champion' back to the 'previous' version")
    rollback_command.add_argument(
        "--reason", required=True, help="why; recorded on the version rolled back from"
    )
    _add_registry_options(rollback_command, model_name_required=False)
    _add_lock_options(rollback_command)
    rollback_command.set_defaults(handler=_rollback)
