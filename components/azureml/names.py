"""The names Azure ML gives its jobs and schedules: one rule, for every place that checks one (a job name
the dry run is asked about, a schedule's --name), so a name refused here is the one Azure ML would refuse."""

from __future__ import annotations

import re

RESOURCE_NAME_FORM = "1-255 letters, digits, '-' or '_', starting with a letter or digit"
_RESOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,254}")


def is_resource_name(name: str) -> bool:
    """Whether `name` can name an Azure ML job or schedule."""
    return _RESOURCE_NAME.fullmatch(name) is not None
