"""The envelope of an Event Grid event, in either delivery schema, and the field readers the parsers share.

Event Grid delivers `{id, topic, subject, eventType, eventTime, data, dataVersion, metadataVersion}`;
CloudEvents 1.0 delivers `{specversion, id, source, type, time, subject, data}`. Both become one
`Envelope`. A field that is missing, mistyped or malformed raises `Invalid`, which the parsers turn into a
`Rejection`: it never escapes them. Every piece of the event quoted in a reason goes through `shown`, so a
reason is one line, bounded, and free of secrets.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core.text import has_unsafe_characters  # one definition of unsafe, shared with training
from function_app.settings.app import mask_secrets

EVENT_GRID, CLOUD_EVENTS = "eventgrid", "cloudevents"
CLOUD_EVENTS_VERSION = "1.0"
MAX_EVENT_ID_CHARS = 256
MAX_SHOWN_CHARS = 80


class Invalid(Exception):
    """A permanent problem with an event or request; `reason` is the one-line rejection reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Envelope:
    schema: str  # EVENT_GRID or CLOUD_EVENTS
    event_id: str
    event_type: str
    source: str | None  # Event Grid's topic, CloudEvents' source
    subject: str | None
    time: datetime | None
    data: Mapping[str, Any]


def shown(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """A piece of untrusted input, quoted for a reason or a log line: one line, bounded, secrets masked."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)[:limit]  # a number cannot hide a secret, and says what was wrong with it
    if not isinstance(value, str):
        return f"a JSON {json_type(value)}"
    text = mask_secrets(value)
    clipped = text if len(text) <= limit else text[: limit - 3] + "..."
    return ascii(clipped)  # escapes control and non-ASCII characters: a reason can never break a log line


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def load_json(text: str | bytes, what: str) -> Any:
    """Strict JSON: no duplicate keys (which value would count is ambiguous), no NaN or Infinity."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except Invalid as err:
        raise Invalid(f"{what}: {err.reason}; expected JSON") from None
    except RecursionError:
        raise Invalid(f"{what}: nested too deeply; expected a flat JSON object") from None
    except ValueError as err:  # JSONDecodeError, and UnicodeDecodeError for undecodable bytes
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise Invalid(f"{what}: not JSON ({first_line[:100]}); expected JSON") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise Invalid(f"duplicate key {shown(key)}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise Invalid(f"{name} is not a JSON number")


def event_id_of(event: Any) -> str | None:
    """The event's id if it has a usable one, for a rejection that names its event."""
    if not isinstance(event, Mapping):
        return None
    value = event.get("id")
    if isinstance(value, str) and 0 < len(value) <= MAX_EVENT_ID_CHARS and not has_unsafe_characters(value):
        return value
    return None


def read_envelope(event: Any) -> Envelope:
    """The envelope of `event` in whichever schema it is; raises `Invalid`."""
    if not isinstance(event, Mapping):
        raise Invalid(f"the event is {shown(event)}; expected a JSON object")
    if "specversion" in event:
        return _cloud_event(event)
    if "eventType" in event:
        return _event_grid_event(event)
    raise Invalid(
        "the event has neither 'eventType' (Event Grid schema) nor 'specversion' and 'type' "
        "(CloudEvents 1.0); expected one of the two schemas"
    )


def _event_grid_event(event: Mapping[str, Any]) -> Envelope:
    for name in ("dataVersion", "metadataVersion"):
        optional_text(event, name, "the event")
    return Envelope(
        schema=EVENT_GRID,
        event_id=_event_id(event),
        event_type=text(event, "eventType", "the event", max_chars=256),
        source=optional_text(event, "topic", "the event"),
        subject=text(event, "subject", "the event", max_chars=2048),
        time=timestamp(event, "eventTime", "the event"),
        data=_data(event),
    )


def _cloud_event(event: Mapping[str, Any]) -> Envelope:
    version = event.get("specversion")
    if version != CLOUD_EVENTS_VERSION:
        raise Invalid(f"the event's specversion is {shown(version)}; expected '{CLOUD_EVENTS_VERSION}'")
    if "data_base64" in event:
        raise Invalid("the event carries binary 'data_base64'; expected JSON 'data'")
    subject = optional_text(event, "subject", "the event")
    return Envelope(
        schema=CLOUD_EVENTS,
        event_id=_event_id(event),
        event_type=text(event, "type", "the event", max_chars=256),
        source=text(event, "source", "the event", max_chars=2048),
        subject=subject,
        time=timestamp(event, "time", "the event") if event.get("time") is not None else None,
        data=_data(event),
    )


def _event_id(event: Mapping[str, Any]) -> str:
    value = text(event, "id", "the event", max_chars=MAX_EVENT_ID_CHARS)
    if has_unsafe_characters(value):
        raise Invalid(f"the event's 'id' {shown(value)} has control characters; expected a plain identifier")
    return value


def _data(event: Mapping[str, Any]) -> Mapping[str, Any]:
    if "data" not in event:
        raise Invalid("the event has no 'data'; expected a JSON object")
    data = event["data"]
    if not isinstance(data, Mapping):
        raise Invalid(f"the event's 'data' is {shown(data)}; expected a JSON object")
    return data


def text(mapping: Mapping[str, Any], key: str, where: str, *, max_chars: int = 1024) -> str:
    """A required, non-empty string field of at most `max_chars` characters."""
    if key not in mapping or mapping[key] is None:
        raise Invalid(f"{where} has no {key!r}; expected a string")
    value = mapping[key]
    if not isinstance(value, str):
        raise Invalid(f"{where}'s {key!r} is {shown(value)}; expected a string")
    if not value or len(value) > max_chars:
        raise Invalid(f"{where}'s {key!r} has {len(value)} characters; expected 1 to {max_chars}")
    return value


def optional_text(mapping: Mapping[str, Any], key: str, where: str, *, max_chars: int = 2048) -> str | None:
    """A string field that may be absent or null (Event Grid sends '' for some, e.g. dataVersion)."""
    if mapping.get(key) is None:
        return None
    value = mapping[key]
    if not isinstance(value, str) or len(value) > max_chars:
        raise Invalid(
            f"{where}'s {key!r} is {shown(value)}; expected a string of at most {max_chars} characters"
        )
    return value


def pattern_text(
    mapping: Mapping[str, Any], key: str, where: str, pattern: re.Pattern[str], form: str
) -> str:
    """A required string field that must match `pattern` entirely; `form` describes it for the reason."""
    value = text(mapping, key, where)
    if not pattern.fullmatch(value):
        raise Invalid(f"{where}'s {key!r} {shown(value)} is malformed; expected {form}")
    return value


def whole_number(mapping: Mapping[str, Any], key: str, where: str) -> int:
    """A required JSON integer (not a boolean, not a fraction)."""
    value = mapping.get(key)
    if value is None:
        raise Invalid(f"{where} has no {key!r}; expected a whole number")
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"{where}'s {key!r} is {shown(value)}; expected a whole number")
    return value


def finite_number(mapping: Mapping[str, Any], key: str, where: str) -> float:
    value = mapping.get(key)
    if value is None:
        raise Invalid(f"{where} has no {key!r}; expected a number")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Invalid(f"{where}'s {key!r} is {shown(value)}; expected a finite number")
    return float(value)


def timestamp(mapping: Mapping[str, Any], key: str, where: str) -> datetime:
    """An ISO 8601 time; one without a zone is UTC, as Event Grid's times are."""
    value = text(mapping, key, where, max_chars=64)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise Invalid(
            f"{where}'s {key!r} {shown(value)} is not a time; expected ISO 8601 such as 2026-11-29T10:00:00Z"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def casefolded(mapping: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`mapping` with its keys casefolded: Azure ML's events have spelled theirs 'RunId' and 'runId'.
    Two keys that differ only in case make the event ambiguous."""
    folded: dict[str, Any] = {}
    for key, value in mapping.items():
        name = str(key).casefold()
        if name in folded:
            raise Invalid(f"{where} has {shown(str(key))} twice (in different cases); expected each key once")
        folded[name] = value
    return folded
