"""The model name: a registered model's name, which every room checks against this one rule (a run
request, a job name, a configuration file, the app settings, the policy state, the registry and the
drift check), so a name one room accepts is never refused by the next."""

from __future__ import annotations

import re
from collections.abc import Callable

from core.errors import InputError, RetrainError
from core.text import quoted

MODEL_NAME_FORM = "1-40 lowercase letters, digits or '-', starting with a letter"
_MODEL_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")


def is_model_name(name: object) -> bool:
    return isinstance(name, str) and _MODEL_NAME.fullmatch(name) is not None


def check_model_name(
    name: object, where: str = "model name", error: Callable[[str], RetrainError] = InputError
) -> str:
    """`name` if it is a model name; else `error` (the caller's room's error type) with one line naming
    `where` it was read (an option, a setting, a file's key), the value and the expected form."""
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name):
        shown = quoted(name, 60) if isinstance(name, str) else f"{type(name).__name__} {quoted(name, 60)}"
        raise error(f"{where} {shown}: expected {MODEL_NAME_FORM}")
    return name
