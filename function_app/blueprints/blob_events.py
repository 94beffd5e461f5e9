"""Event Grid: `Microsoft.Storage.BlobCreated` from the landing container, either delivery schema."""

from __future__ import annotations

import logging

import azure.functions as func

from function_app.blueprints.event_payload import blob_name, event_payload
from function_app.events.triggers import KIND_BLOB
from function_app.runtime import front_door

log = logging.getLogger(__name__)
blueprint = func.Blueprint()


@blueprint.function_name("on_blob_created")
@blueprint.event_grid_trigger(arg_name="event")
# `str`: the worker hands over the event's JSON text, in either schema, on every azure-functions version
# (event_payload.py says why not the library's event classes).
def on_blob_created(event: str) -> None:
    # A rejection returns normally (acknowledged, recorded); a transient failure raises so Event Grid retries.
    payload = event_payload(event)
    outcome = front_door().deliver(payload, family=KIND_BLOB)
    # One line per invocation, naming the upload; the event id only when the subject names no blob.
    name = blob_name(payload)
    shown = f"blob {name}" if name is not None else f"blob event {outcome.event_id}"
    log.info("%s: %s (%s)", shown, outcome.decision, outcome.reason)
