"""The Functions worker's part, played on one machine: an Event Grid payload turned into the object the
worker hands a trigger (the event's JSON text), and the trigger's handler invoked with it, as the
host would, with the handler's own log lines caught for printing."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from function_app.events.parsing import STORAGE_EVENT_PREFIX
from function_app.events.triggers import KIND_BLOB, KIND_DRIFT

_HANDLER_LOGGER = "function_app.blueprints"


def worker_event(payload: Mapping[str, Any]) -> str:
    """What the Functions worker hands our Event Grid handlers for `payload`: its JSON text. Their parameter
    is annotated `str`, so the worker takes its generic binding, which passes the event through as the host
    delivered it, in either schema, on every azure-functions version (blueprints/event_payload.py)."""
    return json.dumps(payload)


def event_family(payload: Mapping[str, Any]) -> str:
    """The trigger an event reaches: storage events go to the blob trigger's subscription, the rest to the
    drift trigger's (which rejects what is not a drift alert)."""
    event_type = payload.get("type") if "specversion" in payload else payload.get("eventType")
    is_storage = isinstance(event_type, str) and event_type.startswith(STORAGE_EVENT_PREFIX)
    return KIND_BLOB if is_storage else KIND_DRIFT


def trigger_handler(family: str) -> Callable[[Any], None]:
    """The Event Grid handler function of a trigger family, as the blueprint registered it."""
    from function_app.blueprints import blob_events, drift_events

    return blob_events.on_blob_created if family == KIND_BLOB else drift_events.on_drift_alert


class _LineCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def handler_log() -> Iterator[list[str]]:
    """The trigger handlers' own log lines while in the block: what the host shows for each invocation.
    They are caught, not passed on to the root logger too: the command prints each once, on stdout."""
    logger, catcher = logging.getLogger(_HANDLER_LOGGER), _LineCatcher()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(catcher)
    logger.propagate = False
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield catcher.lines
    finally:
        logger.removeHandler(catcher)
        logger.setLevel(level)
        logger.propagate = propagate


def deliver(payload: Mapping[str, Any], family: str) -> list[str]:
    """Invoke the trigger's handler with `payload` as the worker would; returns the handler's log lines.
    A transient failure raises out of the handler, as it would for Event Grid to retry."""
    handler = trigger_handler(family)
    with handler_log() as lines:
        handler(worker_event(payload))
    return lines
