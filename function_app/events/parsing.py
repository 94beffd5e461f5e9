"""The front door's parsing: any event or request in, one typed `TriggerRequest` or a rejection out.

Pure functions, with the settings and the clock passed in. A permanent problem (wrong type, foreign
container, malformed data, path tricks) is a `Rejection` (an `HttpRejection` for HTTP) carrying a one-line
reason, never an exception; the caller acknowledges and records it. The families live in their modules:

- blob_events.py    Microsoft.Storage.BlobCreated
- drift_events.py   Azure ML model-monitor RunStatusChanged, v1 DatasetDriftDetected, Retrain.DriftDetected
- http_requests.py  POST /api/retrain

Dedupe keys (`TriggerRequest.dedupe_key`) start with the kind: 'blob:<url>#<eTag>', 'drift:run:<run id>',
'drift:v1:<monitor id>/<run id>', 'drift:check:<check id>', 'http:<Idempotency-Key or a unique id>'.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from core.errors import RetrainError
from function_app.events.blob_created import BLOB_CREATED, parse_blob_created
from function_app.events.drift_alerts import DRIFT_EVENT_TYPES, parse_drift_alert
from function_app.events.envelope import Invalid, json_type, load_json
from function_app.events.http_retrain import HttpRejection, parse_http_retrain
from function_app.events.triggers import Rejection, TriggerRequest
from function_app.settings.app import AppSettings

__all__ = [
    "BLOB_CREATED",
    "DRIFT_EVENT_TYPES",
    "HttpRejection",
    "PayloadError",
    "load_event_grid_payload",
    "parse_blob_created",
    "parse_drift_alert",
    "parse_event",
    "parse_http_retrain",
]

STORAGE_EVENT_PREFIX = "Microsoft.Storage."


class PayloadError(RetrainError, ValueError):
    """A delivery that is not JSON, or not an event object or array of them; the message is one line.
    Still a ValueError, which the HTTP trigger catches."""

    one_line = False  # kept as written


def load_event_grid_payload(text: str) -> list[dict[str, Any]]:
    """The events of an Event Grid delivery: a JSON object (one event) or an array of them, either schema."""
    try:
        document = load_json(text, "the Event Grid payload")
    except Invalid as err:
        raise PayloadError(err.reason) from None
    events = document if isinstance(document, list) else [document]
    for position, event in enumerate(events):
        if not isinstance(event, dict):
            where = f"element {position} of the array" if isinstance(document, list) else "the payload"
            raise PayloadError(
                f"the Event Grid payload's {where} is a JSON {json_type(event)}; expected an event object"
            )
    return events


def parse_event(event: Mapping[str, Any], settings: AppSettings, now: datetime) -> TriggerRequest | Rejection:
    """Dispatch on the event type (`eventType`, or CloudEvents' `type`): blob uploads to
    `parse_blob_created`, everything else to `parse_drift_alert`, which rejects what is not a drift alert."""
    if _event_type(event).startswith(STORAGE_EVENT_PREFIX):
        return parse_blob_created(event, settings, now)
    return parse_drift_alert(event, settings, now)


def _event_type(event: Any) -> str:
    if not isinstance(event, Mapping):
        return ""
    value = event.get("type") if "specversion" in event else event.get("eventType")
    return value if isinstance(value, str) else ""
