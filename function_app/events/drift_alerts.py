"""Drift alerts into a trigger: three event types, in the Event Grid or the CloudEvents 1.0 schema.

- `Microsoft.MachineLearningServices.RunStatusChanged` from Azure ML model monitoring: a drift alert only
  when the run's tags carry `azureml_modelmonitor_threshold_breached` (the monitor sets it on a signal run
  that breached a threshold); every other run status change is rejected. Keyed by the run id. Its model is
  the run's `retrain.model_name` tag (the tag our scheduled runs carry; give the monitor it), else the only
  served model.
- `Microsoft.MachineLearningServices.DatasetDriftDetected`, data drift v1. Keyed by the drift monitor's id
  and its run id. It names no model: the only served model's, refused when several are served.
- `Retrain.DriftDetected`, the project's own drift check. Its `data` (dataVersion "1"):

      model_name    string, required: the model checked; must be one this front door serves
      check_id      string, required: the drift check's run id, 1-128 of [A-Za-z0-9._:-]; the dedupe key
      metric        string, required: what was measured, 1-128 of [A-Za-z0-9._:-] (e.g. 'psi')
      value         number, required: the measured value (finite)
      threshold     number, required: the threshold it was compared with (finite)
      data_version  string, optional: the raw data version checked, 'rd-<16 hex>'

  Fields not listed are ignored, so a newer publisher's additions do not lose alerts.

Azure ML spells its data keys 'RunId' in some documents and 'runId' in others: they are read regardless of
case. What an alert says (the breach message, the metric) goes into the trigger's reason.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from core.versions import VERSION_PATTERN
from function_app.events.envelope import (
    Envelope,
    Invalid,
    casefolded,
    event_id_of,
    finite_number,
    optional_text,
    pattern_text,
    read_envelope,
    shown,
    text,
)
from function_app.events.routing import only_route, route_named
from function_app.events.triggers import KIND_DRIFT, Rejection, TriggerRequest
from function_app.settings.app import AppSettings
from function_app.settings.models import ModelRoute

log = logging.getLogger(__name__)

RUN_STATUS_CHANGED = "Microsoft.MachineLearningServices.RunStatusChanged"
DATASET_DRIFT_DETECTED = "Microsoft.MachineLearningServices.DatasetDriftDetected"
RETRAIN_DRIFT_DETECTED = "Retrain.DriftDetected"
DRIFT_EVENT_TYPES = (RUN_STATUS_CHANGED, DATASET_DRIFT_DETECTED, RETRAIN_DRIFT_DETECTED)
RETRAIN_DRIFT_DATA_VERSION = "1"
THRESHOLD_BREACHED_TAG = "azureml_modelmonitor_threshold_breached"
MODEL_TAG = "retrain.model_name"  # components/azureml/schedule.py tags scheduled runs with it too

_WORKSPACE_SOURCE = re.compile(
    r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.MachineLearningServices/workspaces/[^/]+",
    re.IGNORECASE,
)
_RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,256}")
_CHECK_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_METRIC = _CHECK_ID
_RUN_ID_FORM = "an Azure ML run id of letters, digits, '.', '_', ':' or '-'"
MAX_MESSAGE_CHARS = 200


def parse_drift_alert(
    event: Mapping[str, Any], settings: AppSettings, now: datetime
) -> TriggerRequest | Rejection:
    """A drift alert as a trigger for the model it is about, or the reason it is not one."""
    try:
        envelope = read_envelope(event)
        key, reason, route = _alert(envelope, settings)
    except Invalid as err:
        rejection = Rejection(KIND_DRIFT, event_id_of(event), err.reason)
        log.debug("rejected drift event %s: %s", rejection.event_id, rejection.reason)
        return rejection
    return TriggerRequest(
        kind=KIND_DRIFT,
        event_id=envelope.event_id,
        dedupe_key=f"{KIND_DRIFT}:{key}",
        model_name=route.name,
        received_at=now,
        reason=reason,
    )


def _alert(envelope: Envelope, settings: AppSettings) -> tuple[str, str, ModelRoute]:
    """(dedupe key within drift alerts, reason, model) of a drift alert; raises `Invalid`."""
    if envelope.event_type == RUN_STATUS_CHANGED:
        _check_workspace_source(envelope.source)
        return _monitor_breach(casefolded(envelope.data, "the event data"), settings)
    if envelope.event_type == DATASET_DRIFT_DETECTED:
        _check_workspace_source(envelope.source)
        key, reason = _dataset_drift(casefolded(envelope.data, "the event data"))
        return key, reason, only_route(settings.models, "a data drift (v1) alert")
    if envelope.event_type == RETRAIN_DRIFT_DETECTED:
        return _retrain_drift(envelope.data, settings)
    raise Invalid(
        f"event type {shown(envelope.event_type)} is not a drift alert; expected one of "
        f"{', '.join(DRIFT_EVENT_TYPES)}"
    )


def _check_workspace_source(source: str | None) -> None:
    if source is not None and not _WORKSPACE_SOURCE.fullmatch(source):
        raise Invalid(
            f"the event's topic {shown(source, 200)} is not an Azure ML workspace; expected "
            "/subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.MachineLearningServices/workspaces/<name>"
        )


def _monitor_breach(data: Mapping[str, Any], settings: AppSettings) -> tuple[str, str, ModelRoute]:
    run_id = pattern_text(data, "runid", "the event data", _RUN_ID, _RUN_ID_FORM)
    tags = data.get("runtags")
    if not isinstance(tags, Mapping):
        raise Invalid(f"the event data's 'RunTags' is {shown(tags)}; expected a JSON object of run tags")
    tags = casefolded(tags, "the run's tags")
    breach = tags.get(THRESHOLD_BREACHED_TAG)
    if breach is None:
        raise Invalid(
            f"run {run_id}'s tags carry no {THRESHOLD_BREACHED_TAG}: a run status change, not a drift alert"
        )
    if not isinstance(breach, str) or not breach.strip():
        raise Invalid(f"run {run_id}'s tag {THRESHOLD_BREACHED_TAG} is {shown(breach)}; expected a message")
    model = tags.get(MODEL_TAG)
    if model is None:
        route = only_route(settings.models, f"model monitor run {run_id} (no {MODEL_TAG} tag)")
    elif isinstance(model, str):
        route = route_named(model, settings.models, f"run {run_id}'s {MODEL_TAG} tag")
    else:
        raise Invalid(f"run {run_id}'s tag {MODEL_TAG} is {shown(model)}; expected a model name")
    return f"run:{run_id}", f"model monitor run {run_id}: {_message(breach)}", route


def _dataset_drift(data: Mapping[str, Any]) -> tuple[str, str]:
    monitor_id = pattern_text(data, "datadriftid", "the event data", _RUN_ID, "a drift monitor id")
    run_id = pattern_text(data, "runid", "the event data", _RUN_ID, _RUN_ID_FORM)
    name = optional_text(data, "datadriftname", "the event data", max_chars=256)
    coefficient = finite_number(data, "driftcoefficient", "the event data")
    monitor = _message(name) if name else monitor_id
    return (
        f"v1:{monitor_id}/{run_id}",
        f"dataset drift monitor {monitor} run {run_id}: coefficient {coefficient:g}",
    )


def _retrain_drift(data: Mapping[str, Any], settings: AppSettings) -> tuple[str, str, ModelRoute]:
    where = "the event data"
    route = route_named(text(data, "model_name", where, max_chars=64), settings.models, "drift of model")
    check_id = pattern_text(
        data, "check_id", where, _CHECK_ID, "1-128 of letters, digits, '.', '_', ':' or '-'"
    )
    metric = pattern_text(data, "metric", where, _METRIC, "1-128 of letters, digits, '.', '_', ':' or '-'")
    value = finite_number(data, "value", where)
    threshold = finite_number(data, "threshold", where)
    data_version = None
    if data.get("data_version") is not None:
        data_version = pattern_text(data, "data_version", where, VERSION_PATTERN, "'rd-<16 hex digits>'")
    on_data = f" on {data_version}" if data_version else ""
    return (
        f"check:{check_id}",
        f"drift check {check_id}: {metric} {value:g} against threshold {threshold:g}{on_data}",
        route,
    )


def _message(text: str) -> str:
    """An alert's own words for a reason: one line, bounded, without quotes around it."""
    return shown(" ".join(text.split()), MAX_MESSAGE_CHARS)[1:-1]
