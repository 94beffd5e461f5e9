"""Event Grid: drift alerts (Azure ML model monitoring, v1 dataset drift, and our own drift check)."""

from __future__ import annotations

import logging

import azure.functions as func

from function_app.blueprints.event_payload import event_payload
from function_app.events.triggers import KIND_DRIFT
from function_app.runtime import front_door

log = logging.getLogger(__name__)
blueprint = func.Blueprint()


@blueprint.function_name("on_drift_alert")
@blueprint.event_grid_trigger(arg_name="event")
# `str`: the worker hands over the event's JSON text, in either schema, on every azure-functions version
# (event_payload.py says why not the library's event classes).
def on_drift_alert(event: str) -> None:
    outcome = front_door().deliver(event_payload(event), family=KIND_DRIFT)
    log.info("drift event %s: %s (%s)", outcome.event_id, outcome.decision, outcome.reason)
