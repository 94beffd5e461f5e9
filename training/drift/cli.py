"""`retrain drift`: compare the champion's reference data with newly arrived data; alert on drift.

    retrain drift --model-name M --current DIR [--reference DIR] [--task REF [--task-options JSON]]
                  [--psi-threshold 0.2] [--ks-pvalue 0.01] [--min-drifted-features 1] [--bins 10]
                  [--out DIR] [--publish | --no-publish]
                  [--mlflow-tracking-uri URI|off] [--mlflow-experiment retrain-drift]

The features compared are the task's (`Task.drift_features`): the task given, else the one the champion's
lineage records, else `tabular` (training/drift/data.py).

It writes drift.json and drift_psi.png into --out (default <state folder>/drift/<check id>), logs the check
to MLflow, and on an alert publishes `Retrain.DriftDetected` (training/drift/publish.py). Drift is
information, not failure: the exit code is 0 either way, and the last line of output says which.
Publishing is on when RETRAIN_DRIFT_TOPIC_ENDPOINT is set, unless --no-publish; --publish requires it. An
alert that cannot be published is a failure (exit 2, one line), with the report already written.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from core.errors import InputError
from core.files import write_atomically
from core.names import check_model_name
from training.drift.tracking import Tracking, log_check, tracking_of

if TYPE_CHECKING:
    from training.drift.check import DriftPolicy, DriftReport
    from training.drift.data import CurrentData, ReferenceData
    from training.drift.publish import TopicSettings
    from training.tasks.base import Task

log = logging.getLogger(__name__)

REPORT_FILE = "drift.json"
CHART_FILE = "drift_psi.png"
DRIFT_FOLDER = "drift"
DEFAULT_EXPERIMENT = "retrain-drift"
# training/drift/check.py pulls in numpy; the parser is built for every `retrain` command, so defaults
# come later.
_POLICY_DEFAULT = "default: DriftPolicy's, training/drift/check.py"


def _policy(args: argparse.Namespace) -> DriftPolicy:
    from training.drift.check import DriftPolicy

    given = {
        name: getattr(args, name)
        for name in ("psi_threshold", "ks_pvalue", "min_drifted_features", "bins")
        if getattr(args, name) is not None
    }
    return DriftPolicy(**given)


def _topic(args: argparse.Namespace) -> TopicSettings | None:
    from training.drift.publish import TOPIC_ENDPOINT, TopicSettings

    if args.publish is False:
        return None
    settings = TopicSettings.from_environ(args.environ)
    if settings is None and args.publish:
        raise InputError(f"--publish: {TOPIC_ENDPOINT} is not set; expected the drift topic's endpoint")
    return settings


def _task_options(args: argparse.Namespace) -> dict[str, Any] | None:
    from training.tasks.loader import options_from_json, parse_task_options

    options = {**options_from_json(args.task_options), **parse_task_options(args.task_option)}
    if args.task is None and options:
        raise InputError("--task-options/--task-option: give --task too (or neither: the champion's task)")
    return options if args.task is not None else None


def _task_and_reference(
    args: argparse.Namespace, tracking: Tracking | None, scratch: Path
) -> tuple[Task, str, ReferenceData]:
    """The task (and where it came from) and the reference data: --reference, else the champion's."""
    from training.drift.data import champion_of, drift_task, reference_from_folder, reference_from_lineage

    options = _task_options(args)
    if args.reference is not None:
        task, source = drift_task(None, None, args.task, options, scratch)
        return task, source, reference_from_folder(task, args.reference)
    if tracking is None:
        raise InputError(
            "--mlflow-tracking-uri off: the champion's reference data is found through the registry; "
            "give --reference DIR with a prepared data version, or a tracking URI"
        )
    from training.gate.registry import MlflowStore, ModelRegistry

    registry = ModelRegistry(MlflowStore(tracking.uri, tracking.artifact_location))
    champion = champion_of(registry, args.model_name)
    task, source = drift_task(registry, champion, args.task, options, scratch)
    return task, source, reference_from_lineage(task, champion.tags, champion.uri, champion.version)


def _drift(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    from training.drift.check import compare
    from training.drift.data import aligned, read_current
    from training.drift.publish import new_check_id

    stream = stream or sys.stdout
    check_model_name(args.model_name, "--model-name")
    policy = _policy(args)
    topic = _topic(args)  # a bad setting fails before any data is read
    tracking = tracking_of(args.mlflow_tracking_uri, args.environ, args.state_root)
    with tempfile.TemporaryDirectory(prefix="retrain-drift-") as scratch:
        task, task_source, reference = _task_and_reference(args, tracking, Path(scratch))
        log.info("drift features of task %s (from %s)", task.name, task_source)
        current = read_current(task, args.current)
    report = compare(
        reference.features.values,
        aligned(reference.features, current.features),
        reference.features.names,
        policy,
        reference_data_version=reference.data_version,
        current_data_version=current.data_version,
    )
    check_id = new_check_id(datetime.now(UTC))
    out = args.out if args.out is not None else args.state_root / DRIFT_FOLDER / check_id
    document = report_document(report, args.model_name, check_id, reference, current)
    document["task"] = {"name": task.name, "options": dict(task.options()), "from": task_source}
    files = write_outputs(document, report, out)
    event_id = None
    try:
        if report.alert and topic is not None:
            event_id = _publish(report, args.model_name, check_id, reference, topic)
    finally:
        if tracking is not None:
            log_check(tracking, args.mlflow_experiment, args.environ, document, report, files, event_id)
    print(_final_line(args, report, out, event_id, topic), file=stream)
    return 0


def _publish(
    report: DriftReport, model_name: str, check_id: str, reference: ReferenceData, topic: TopicSettings
) -> str:
    from training.drift.publish import drift_event, publish

    extra = {
        "reference_raw_data_version": reference.raw_data_version,
        "reference_model_version": reference.model_version,
    }
    return publish(drift_event(report, model_name, check_id, extra), topic)


def _final_line(
    args: argparse.Namespace,
    report: DriftReport,
    out: Path,
    event_id: str | None,
    topic: TopicSettings | None,
) -> str:
    from training.drift.publish import TOPIC_ENDPOINT

    if event_id is not None and topic is not None:
        sent = f"; event {event_id} published to {topic.shown_endpoint}"
    elif report.alert and args.publish is False:
        sent = "; not published (--no-publish)"
    elif report.alert:
        sent = f"; not published ({TOPIC_ENDPOINT} is not set)"
    else:
        sent = ""
    return f"drift {args.model_name}: {report.summary()}; report in {out / REPORT_FILE}{sent}"


# -- outputs ---------------------------------------------------------------------------------------------


def report_document(
    report: DriftReport, model_name: str, check_id: str, reference: ReferenceData, current: CurrentData
) -> dict[str, Any]:
    document = {"check_id": check_id, "model_name": model_name, **report.to_dict()}
    document["reference"] = {**document["reference"], **reference.describe()}
    document["current"] = {**document["current"], **current.describe()}
    return document


def write_outputs(document: Mapping[str, Any], report: DriftReport, out: Path) -> list[Path]:
    """drift.json and the PSI chart, each written whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=2) + "\n"
    report_path = out / REPORT_FILE
    write_atomically(report_path, lambda handle: handle.write(text.encode()))
    chart = plot_psi(report, out / CHART_FILE)
    log.info("drift report written to %s", report_path)
    return [report_path, chart]


def plot_psi(report: DriftReport, path: Path) -> Path:
    """A bar per feature: its PSI, drifted ones in red, with the threshold as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a build agent or a compute node
    from matplotlib import pyplot as plt

    names = [feature.name for feature in report.features]
    colors = ["tab:red" if feature.drifted else "tab:blue" for feature in report.features]
    figure, axis = plt.subplots(figsize=(max(8.0, 0.15 * len(names)), 4.5), dpi=100)
    try:
        axis.bar(range(len(names)), [feature.psi for feature in report.features], color=colors)
        axis.axhline(report.policy.psi_threshold, linestyle="--", color="black", alpha=0.6)
        axis.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        axis.set(ylabel="population stability index", title=report.summary().split(";")[0])
        figure.tight_layout()
        write_atomically(path, lambda handle: figure.savefig(handle, format="png"))
    finally:
        plt.close(figure)
    return path


# -- parser ----------------------------------------------------------------------------------------------


def add_commands(commands: argparse._SubParsersAction) -> None:
    drift = commands.add_parser(
        "drift", help="compare the champion's training data with newly arrived data; alert on drift"
    )
    drift.add_argument("--model-name", required=True, help="the registered model whose data is checked")
    drift.add_argument(
        "--current", type=Path, required=True, metavar="DIR", help="folder of newly arrived raw batch files"
    )
    drift.add_argument(
        "--reference",
        type=Path,
        metavar="DIR",
        help="a prepared data version to compare with (default: the champion's, from its lineage)",
    )
    drift.add_argument(
        "--task",
        metavar="REF",
        help="the task whose drift features are compared: tabular, image, file.py:Attr, pkg.mod:Attr "
        "(default: the champion's, from its lineage; else tabular)",
    )
    drift.add_argument("--task-options", metavar="JSON", help="the task's options as a JSON object")
    drift.add_argument(
        "--task-option", action="append", metavar="KEY=VALUE", help="one task option (repeatable)"
    )
    policy = drift.add_argument_group("thresholds")
    policy.add_argument(
        "--psi-threshold",
        type=float,
        metavar="NUMBER",
        help=f"a feature's PSI above it drifts ({_POLICY_DEFAULT})",
    )
    policy.add_argument(
        "--ks-pvalue",
        type=float,
        metavar="P",
        help=f"...and its KS p-value below it ({_POLICY_DEFAULT})",
    )
    policy.add_argument(
        "--min-drifted-features",
        type=int,
        metavar="N",
        help=f"drifted features that raise an alert ({_POLICY_DEFAULT})",
    )
    policy.add_argument("--bins", type=int, metavar="N", help=f"PSI quantile bins ({_POLICY_DEFAULT})")
    drift.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"folder for {REPORT_FILE} and {CHART_FILE} (default: <state>/drift/<check id>)",
    )
    drift.add_argument(
        "--publish",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="publish the drift event on an alert (default: when RETRAIN_DRIFT_TOPIC_ENDPOINT is set)",
    )
    drift.add_argument(
        "--mlflow-tracking-uri",
        metavar="URI",
        help="MLflow store for the check and the registry, or 'off' "
        "(default: $MLFLOW_TRACKING_URI, else SQLite in the state folder)",
    )
    drift.add_argument(
        "--mlflow-experiment",
        default=DEFAULT_EXPERIMENT,
        help=f"experiment of the check's run ({DEFAULT_EXPERIMENT})",
    )
    drift.set_defaults(handler=_drift)
