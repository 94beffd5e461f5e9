"""The event the Functions worker hands over, back as the JSON object the parser reads.

The worker gives an `EventGridEvent` for the Event Grid schema and a `CloudEvent` for CloudEvents 1.0 (it
decides by the body's `specversion`, whatever the handler's annotation says); each keeps its own field names.
A handler's log line names a Blob-created event by its blob (`blob_name`), as a person knows the upload.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import azure.functions as func

from function_app.events.blob_paths import subject_blob
from function_app.events.envelope import Invalid


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def event_payload(event: func.EventGridEvent | func.CloudEvent) -> dict[str, Any]:
    if isinstance(event, func.CloudEvent):
        return {
            "specversion": event.specversion,
            "id": event.id,
            "source": event.source,
            "type": event.type,
            "time": _time(event.time),
            "subject": event.subject,
            "data": event.get_json(),
        }
    return {
        "id": event.id,
        "topic": event.topic,
        "subject": event.subject,
        "eventType": event.event_type,
        "eventTime": _time(event.event_time),
        "data": event.get_json(),
        "dataVersion": event.data_version,
    }


def blob_name(payload: dict[str, Any]) -> str | None:
    """The blob a Blob-created event names in its subject, to say which file a decision is about; None when
    the subject is missing or not a safe blob name (then the event is named by its id)."""
    subject = payload.get("subject")
    if not isinstance(subject, str):
        return None
    try:
        return subject_blob(subject)[1]
    except Invalid:
        return None
