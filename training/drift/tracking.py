"""Where a drift check is logged: an MLflow run per check (the job's own run under Azure ML).

The store follows the other steps' convention: 'off' disables it; else --mlflow-tracking-uri, else
$MLFLOW_TRACKING_URI, else the state folder's SQLite store. It is also the registry the champion's lineage
is read from.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.secrets import mask_secrets, mask_secrets_in
from training.local_state import (
    artifacts_beside,
    default_mlflow_artifact_location,
    default_mlflow_tracking_uri,
)

if TYPE_CHECKING:
    from training.drift.check import DriftReport

log = logging.getLogger(__name__)

JOB_RUN_ID_VARIABLE = "MLFLOW_RUN_ID"  # set by Azure ML: the job's own MLflow run


@dataclass(frozen=True)
class Tracking:
    """Where the check is logged; also the registry the champion's lineage is read from."""

    uri: str
    artifact_location: str | None


def tracking_of(option: str | None, environ: Mapping[str, str], state_root: Path) -> Tracking | None:
    """The other steps' convention: 'off' disables; an option, else $MLFLOW_TRACKING_URI, else the state
    folder's SQLite store."""
    if option is not None and option.strip().lower() == "off":
        return None
    if option:
        return Tracking(option, artifacts_beside(option))
    if environ.get("MLFLOW_TRACKING_URI"):
        return Tracking(environ["MLFLOW_TRACKING_URI"], None)
    state_root.mkdir(parents=True, exist_ok=True)
    return Tracking(default_mlflow_tracking_uri(state_root), default_mlflow_artifact_location(state_root))


def log_check(
    tracking: Tracking,
    experiment: str,
    environ: Mapping[str, str],
    document: Mapping[str, Any],
    report: DriftReport,
    files: list[Path],
    event_id: str | None,
) -> str | None:
    """Log the check as an MLflow run (the job's own run under Azure ML); returns its id. Tracking is best
    effort: the report is already on disk, so a store outage is a warning, not a lost check."""
    try:
        return _log_run(tracking, experiment, environ, document, report, files, event_id)
    except Exception as error:  # any store failure; the outputs and the event do not depend on it
        first = next(iter(str(error).strip().splitlines()), type(error).__name__)
        log.warning("could not log the drift check to MLflow: %s", mask_secrets(first)[:300])
        return None


def _log_run(
    tracking: Tracking,
    experiment: str,
    environ: Mapping[str, str],
    document: Mapping[str, Any],
    report: DriftReport,
    files: list[Path],
    event_id: str | None,
) -> str:
    from training.mlflow_setup import mlflow_client

    client = mlflow_client(tracking.uri)
    job_run = environ.get(JOB_RUN_ID_VARIABLE)
    run_id = job_run or client.create_run(_experiment_id(client, experiment, tracking)).info.run_id
    try:
        _log_results(client, run_id, document, report, files, event_id)
    except BaseException:
        # Ours to end, so never left RUNNING: a failed log (or an interrupt) ends it FAILED. Azure ML ends
        # the job's own run itself.
        if not job_run:
            _end_failed(client, run_id)
        raise
    if not job_run:
        client.set_terminated(run_id, status="FINISHED")
    log.info("drift check logged to MLflow run %s", run_id)
    return run_id


def _log_results(
    client: Any,
    run_id: str,
    document: Mapping[str, Any],
    report: DriftReport,
    files: list[Path],
    event_id: str | None,
) -> None:
    import time

    from mlflow.entities import Metric, Param, RunTag

    from training.mlflow_names import keyed, record_renamed

    stamp = int(time.time() * 1000)
    metrics, renamed = keyed(
        {
            "max_psi": report.max_psi,
            "drifted_features": float(len(report.drifted)),
            "min_ks_pvalue": min(feature.ks_pvalue for feature in report.features),
            **{f"psi.{feature.name}": feature.psi for feature in report.features},
        }
    )
    params, renamed_params = keyed(report.policy.describe())
    tags, renamed_tags = keyed(mask_secrets_in(_run_tags(document, report, event_id)))  # may quote a location
    # MLflow takes at most 1000 metrics (and 100 params and tags) a batch; a task may declare more features.
    entries = [Metric(key, float(value), stamp, 0) for key, value in metrics.items()]
    for start in range(0, len(entries), 1000):
        client.log_batch(run_id, metrics=entries[start : start + 1000])
    client.log_batch(
        run_id,
        params=[Param(key, str(value)) for key, value in params.items()],
        tags=[RunTag(key, value) for key, value in tags.items()],
    )
    record_renamed(client, run_id, {**renamed, **renamed_params, **renamed_tags})
    for path in files:
        client.log_artifact(run_id, str(path))


def _end_failed(client: Any, run_id: str) -> None:
    try:
        client.set_terminated(run_id, status="FAILED")
    except Exception as error:  # the store itself is failing: what the caller's warning reports
        log.debug("could not end the drift check's run %s: %s", run_id, error)


def _experiment_id(client: Any, name: str, tracking: Tracking) -> str:
    from training.mlflow_setup import experiment_id

    return experiment_id(client, name, tracking.artifact_location)


def _run_tags(document: Mapping[str, Any], report: DriftReport, event_id: str | None) -> dict[str, str]:
    reference, current = document["reference"], document["current"]
    return {
        "mlflow.runName": document["check_id"],
        "retrain.drift.check_id": document["check_id"],
        "retrain.drift.model_name": document["model_name"],
        "retrain.drift.alert": str(report.alert).lower(),
        "retrain.drift.worst_feature": report.worst.name,
        "retrain.drift.reference_data_version": reference["data_version"],
        "retrain.drift.reference_raw_data_version": reference["raw_data_version"] or "unknown",
        "retrain.drift.reference_model_version": reference["model_version"] or "none",
        "retrain.drift.current_data_version": current["data_version"] or "unknown",
        "retrain.drift.event_id": event_id or "none",
    }
