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
from core.flags import add_flags, config_from_namespace
from core.names import check_model_name
from core.task_ref import written_options
from training.drift.options import CHART_FILE, REPORT_FILE, DriftConfig
from training.drift.tracking import Tracking, log_check, tracking_of
from training.tasks.task_flags import add_task_option_flag, task_options_from_args

if TYPE_CHECKING:
    from training.drift.check import DriftPolicy, DriftReport
    from training.drift.data import CurrentData, ReferenceData
    from training.drift.publish import TopicSettings
    from training.tasks.base import Task

log = logging.getLogger(__name__)

DRIFT_FOLDER = "drift"


def _policy(config: DriftConfig) -> DriftPolicy:
    from training.drift.check import DriftPolicy

    return DriftPolicy(**config.policy_given())


def _topic(config: DriftConfig, environ: Mapping[str, str]) -> TopicSettings | None:
    from training.drift.publish import TOPIC_ENDPOINT, TopicSettings

    if config.publish is False:
        return None
    settings = TopicSettings.from_environ(environ)
    if settings is None and config.publish:
        raise InputError(f"--publish: {TOPIC_ENDPOINT} is not set; expected the drift topic's endpoint")
    return settings


def _task_and_reference(
    config: DriftConfig, tracking: Tracking | None, scratch: Path
) -> tuple[Task, str, ReferenceData]:
    """The task (and where it came from) and the reference data: --reference, else the champion's."""
    from training.drift.data import champion_of, drift_task, reference_from_folder, reference_from_lineage

    options = config.task_options if config.task is not None else None
    if config.reference is not None:
        task, source = drift_task(None, None, config.task, options, scratch)
        return task, source, reference_from_folder(task, config.reference)
    if tracking is None:
        raise InputError(
            "--mlflow-tracking-uri off: the champion's reference data is found through the registry; "
            "give --reference DIR with a prepared data version, or a tracking URI"
        )
    from training.gate.registry import MlflowStore, ModelRegistry

    registry = ModelRegistry(MlflowStore(tracking.uri, tracking.artifact_location))
    champion = champion_of(registry, config.model_name)
    task, source = drift_task(registry, champion, config.task, options, scratch)
    return task, source, reference_from_lineage(task, champion.tags, champion.uri, champion.version)


def _drift(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    from training.drift.check import compare
    from training.drift.data import comparable, read_current
    from training.drift.publish import new_check_id

    stream = stream or sys.stdout
    check_model_name(args.model_name, "--model-name")
    config = config_from_namespace(DriftConfig, args, task_options=task_options_from_args(args))
    policy = _policy(config)
    topic = _topic(config, args.environ)  # a bad setting fails before any data is read
    tracking = tracking_of(config.mlflow_tracking_uri, args.environ, args.state_root)
    with tempfile.TemporaryDirectory(prefix="retrain-drift-") as scratch:
        task, task_source, reference = _task_and_reference(config, tracking, Path(scratch))
        log.info("drift features of task %s (from %s)", task.name, task_source)
        current = read_current(task, config.current)
    compared, current_values = comparable(reference.features, current.features)
    report = compare(
        compared.values,
        current_values,
        compared.names,
        policy,
        reference_data_version=reference.data_version,
        current_data_version=current.data_version,
    )
    check_id = new_check_id(datetime.now(UTC))
    out = config.out if config.out is not None else args.state_root / DRIFT_FOLDER / check_id
    document = report_document(report, config.model_name, check_id, reference, current)
    document["task"] = {"name": task.name, "options": written_options(task.options()), "from": task_source}
    files = write_outputs(document, report, out)
    event_id = None
    try:
        if report.alert and topic is not None:
            event_id = _publish(report, config.model_name, check_id, reference, topic)
    finally:
        if tracking is not None:
            log_check(tracking, config.mlflow_experiment, args.environ, document, report, files, event_id)
    print(_final_line(config, report, out, event_id, topic), file=stream)
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
    config: DriftConfig,
    report: DriftReport,
    out: Path,
    event_id: str | None,
    topic: TopicSettings | None,
) -> str:
    from training.drift.publish import TOPIC_ENDPOINT

    if event_id is not None and topic is not None:
        sent = f"; event {event_id} published to {topic.shown_endpoint}"
    elif report.alert and config.publish is False:
        sent = "; not published (--no-publish)"
    elif report.alert:
        sent = f"; not published ({TOPIC_ENDPOINT} is not set)"
    else:
        sent = ""
    return f"drift {config.model_name}: {report.summary()}; report in {out / REPORT_FILE}{sent}"


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
    add_flags(drift, DriftConfig)
    add_task_option_flag(drift, "one task option (repeatable)")
    drift.set_defaults(handler=_drift)
