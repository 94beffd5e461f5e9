"""The gate's commands: `evaluate` and `register` (pipeline steps), and `models`, `lineage`, `rollback`,
`serve`.

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
from core.flags import add_flags, config_from_namespace
from training.gate.options import (
    DEFAULT_HOST,
    DEFAULT_MODEL_NAME,
    DEFAULT_PORT,
    DEFAULT_WORKERS,
    LOCKS_FOLDER,
    MODEL_NAME_HELP,
    TASK_OPTION_HELP,
    TRACKING_HELP,
    EvaluateConfig,
    RegisterConfig,
)
from training.tasks.task_flags import add_task_option_flag, task_options_from_args

if TYPE_CHECKING:
    from training.gate.lock import RegistryLock
    from training.gate.registry import ModelRegistry

PIPELINE_JOB_VARIABLES = ("AZUREML_ROOT_RUN_ID", "RETRAIN_PIPELINE_RUN")  # Azure ML's, the local runner's
_FAMILY_MEMBER = re.compile(r".+_\d+")  # recall_3: one of a family, left out of the listing's columns
LISTED_METRICS = 3


def _registry(args: argparse.Namespace) -> ModelRegistry:
    """The registry, with `args.model_name` settled: as given, else the one model registered there. With
    several, which one is meant is not guessed (one line asks for --model-name); with none, the default
    name stands, so that `models` says it has no versions."""
    from core.names import check_model_name
    from training.gate.registry import ModelRegistry, resolve_store

    registry = ModelRegistry(resolve_store(args.mlflow_tracking_uri, args.environ, args.state_root))
    if args.model_name is None:
        names = registry.model_names()
        if len(names) > 1:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise InputError(
                f"{len(names)} models are registered ({shown}); expected --model-name NAME, one of them"
            )
        args.model_name = names[0] if names else DEFAULT_MODEL_NAME
    check_model_name(args.model_name, "--model-name")
    return registry


def _lock(args: argparse.Namespace) -> RegistryLock:
    from training.gate.lock import open_registry_lock

    spec = args.lock if args.lock is not None else str(args.state_root / LOCKS_FOLDER)
    return open_registry_lock(spec, args.model_name, args.environ, args.lock_wait)


# -- handlers -------------------------------------------------------------------------------------------


def _task(config: EvaluateConfig | RegisterConfig) -> tuple[str | None, dict[str, Any] | None]:
    """--task with its options; (None, None) without --task: the task the model file records."""
    return (None, None) if config.task is None else (config.task, config.task_options)


def _evaluate(args: argparse.Namespace) -> int:
    from training.gate.evaluate import GateInputs, write_evaluation

    config = config_from_namespace(EvaluateConfig, args, task_options=task_options_from_args(args))
    task_ref, task_options = _task(config)
    registry = _registry(args)
    gate = GateInputs(
        config.primary_metric, config.confidence, config.bootstrap_resamples, config.bootstrap_seed
    )
    write_evaluation(
        config.model, config.data, config.model_name, registry, config.out, task_ref, task_options, gate
    )
    return 0


def _register(args: argparse.Namespace) -> int:
    from training.gate.lineage import Trigger
    from training.gate.register import RegisterRequest, write_registration

    config = config_from_namespace(RegisterConfig, args, task_options=task_options_from_args(args))
    task_ref, task_options = _task(config)
    pipeline_job = next(
        (args.environ[name] for name in PIPELINE_JOB_VARIABLES if args.environ.get(name)), None
    )
    request = RegisterRequest(
        model_dir=config.model,
        evaluation_dir=config.evaluation,
        data_dir=config.data,
        model_name=config.model_name,
        trigger=Trigger.parse(config.trigger),
        raw_data_version=config.raw_data_version,
        environment_version=config.environment_version,
        pipeline_job=pipeline_job,
        experiment=config.mlflow_experiment,
        gate=config.policy.given(),
        task_ref=task_ref,
        task_options=task_options,
    )
    write_registration(request, _registry(args), _lock(args), config.out)
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


def _serve(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    from training.gate.registry import resolve_store
    from training.gate.scoring_server import become_server, serve_command

    stream = stream or sys.stdout
    store = resolve_store(args.mlflow_tracking_uri, args.environ, args.state_root)
    command = serve_command(store, args.name, args.host, args.port, args.workers, args.environ)
    print(
        f"serving {args.name} v{command.version} ({args.name}@champion) at {command.url}: "
        f"POST {command.url}/invocations; GET {command.url}/ping; Ctrl-C stops it",
        file=stream,
        flush=True,
    )
    become_server(command)
    return 0  # not reached: the server replaced this process


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
        where = entry.get("file") or f"{entry.get('parts', '?')} parts"  # tabular's in parts (parts.py)
        lines.append(f"    split {name}: {entry.get('rows', '?')} rows in {where}")
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


def _add_registry_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-name",
        help=f"{MODEL_NAME_HELP} (default: the one model registered; needed when there are several)",
    )
    parser.add_argument("--mlflow-tracking-uri", help=TRACKING_HELP)


def add_commands(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "evaluate", help="score a candidate and the champion on the same test split"
    )
    add_flags(evaluate, EvaluateConfig)
    add_task_option_flag(evaluate, TASK_OPTION_HELP)
    evaluate.set_defaults(handler=_evaluate)

    register = commands.add_parser("register", help="gate an evaluated candidate; register it if it passes")
    add_flags(register, RegisterConfig)
    add_task_option_flag(register, TASK_OPTION_HELP)
    register.set_defaults(handler=_register)

    models = commands.add_parser("models", help="registered versions with aliases, metrics and lineage")
    models.add_argument("--json", action="store_true", help="machine-readable output")
    _add_registry_options(models)
    models.set_defaults(handler=_models)

    lineage = commands.add_parser(
        "lineage", help="from a model version back to its trigger and data manifest"
    )
    lineage.add_argument("version", help="the version number (e.g. 3)")
    lineage.add_argument("--json", action="store_true", help="machine-readable output")
    _add_registry_options(lineage)
    lineage.set_defaults(handler=_lineage)

    rollback_command = commands.add_parser("rollback", help="move 'champion' back to the 'previous' version")
    rollback_command.add_argument(
        "--reason", required=True, help="why; recorded on the version rolled back from"
    )
    _add_registry_options(rollback_command)
    add_flags(rollback_command, RegisterConfig, only=("lock", "lock_wait"))  # the lock register takes
    rollback_command.set_defaults(handler=_rollback)

    serve = commands.add_parser(
        "serve", help="serve the champion through MLflow's scoring server (mlflow models serve)"
    )
    serve.add_argument("name", help=MODEL_NAME_HELP)
    serve.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only)",
    )
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    serve.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, help=f"server processes (default {DEFAULT_WORKERS})"
    )
    serve.add_argument("--mlflow-tracking-uri", help=TRACKING_HELP)
    serve.set_defaults(handler=_serve)
