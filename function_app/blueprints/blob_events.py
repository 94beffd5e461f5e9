"""Event Grid: `Microsoft.Storage.BlobCreated` from the landing container, either delivery schema."""

from __future__ import annotations

import logging

import azure.functions as func

from function_app.blueprints.event_payload import event_payload
from function_app.events.triggers import KIND_BLOB
from function_app.runtime import front_door

log = logging.getLogger(__name__)
blueprint = func.Blueprint()


@blueprint.function_name("on_blob_created")
@blueprint.event_grid_trigger(arg_name="event")
# Annotated EventGridEvent (the worker checks it); a CloudEvents delivery arrives as func.CloudEvent.
def on_blob_created(event: func.EventGridEvent) -> None:
    # A rejection returns normally (acknowledged, recorded); a transient failure raises so Event Grid retries.
    outcome = front_door().deliver(event_payload(event), family=KIND_BLOB)
    log.info("blob event %s: %s (%s)", outcome.event_id, outcome.decision, outcome.reason)
