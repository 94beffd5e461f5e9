"""The one front door of this worker process, built from the app settings when the entry file loads.

Settings are read once, at start-up, from the environment (that is how a Function App receives them): an
invalid one stops start-up with a message naming it, before any trigger is indexed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from function_app.service import FrontDoor
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

log = logging.getLogger(__name__)
_started: list[FrontDoor] = []


def start(environ: Mapping[str, str]) -> FrontDoor:
    settings = AppSettings.from_environ(environ)
    log.debug("front door settings: %s", settings.describe())
    _started[:] = [build_front_door(settings, environ)]
    return _started[0]


def front_door() -> FrontDoor:
    if not _started:
        raise RuntimeError("the front door was not started; import function_entry (or call runtime.start)")
    return _started[0]
