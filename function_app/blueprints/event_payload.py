"""The event the Functions worker hands over, back as the JSON object the parser reads.

The Event Grid handlers annotate their parameter `str`, so the worker hands them the event's JSON text as the
host delivered it (its generic binding), in either schema, whatever azure-functions the host loads. The
library's own event objects differ between versions: before 1.25 there is no `func.CloudEvent`, and its
converter turns a CloudEvents delivery into an `EventGridEvent` without the type, source or time, so a
handler annotated `func.EventGridEvent` could not tell a CloudEvents BlobCreated from anything else there.
A handler's log line names a Blob-created event by its blob (`blob_name`), as a person knows the upload.
"""

from __future__ import annotations

from typing import Any

from function_app.events.blob_paths import subject_blob
from function_app.events.envelope import Invalid, load_json


def event_payload(event: str | bytes) -> Any:
    """The delivered event as JSON; text that is not JSON is passed on as is, for the parser to reject
    (it names what it got and expects a JSON object), so the rejection is recorded, not retried."""
    try:
        return load_json(event, "the Event Grid event")
    except Invalid:
        return event


def blob_name(payload: Any) -> str | None:
    """The blob a Blob-created event names in its subject, to say which file a decision is about; None when
    the subject is missing or not a safe blob name (then the event is named by its id)."""
    subject = payload.get("subject") if isinstance(payload, dict) else None
    if not isinstance(subject, str):
        return None
    try:
        return subject_blob(subject)[1]
    except Invalid:
        return None
