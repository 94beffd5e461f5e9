"""RETRAIN_WARM_START: whether Retrain may fork an interpreter that has imported torch and MLflow already,
instead of exec'ing a fresh one.

Every fork of a warm start is under it: the local run's starter forking its steps (components/local/warm.py,
training/warm/), and `retrain train`'s launcher forking torchrun's agent, which forks the workers
(training/engine/launch.py, torchrun_agent.py). Off, each of them is a fresh interpreter, exec'd as it
would be without warm starts: the way to rule a fork out when a step misbehaves. The runner reads it from
its environment and its steps inherit that environment, so the steps' launchers read the same value.

Read here alone, for every room (components/ and training/ may not import each other): one spelling of the
variable, one set of accepted words, one message for a value outside them.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.errors import InputError
from core.flags import FALSE_WORDS, TRUE_WORDS

WARM_START_VARIABLE = "RETRAIN_WARM_START"


def warm_start_setting(environ: Mapping[str, str]) -> bool:
    """RETRAIN_WARM_START: `on` (the default; also 1, true, yes) or `off` (0, false, no)."""
    value = environ.get(WARM_START_VARIABLE, "on").strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise InputError(
        f"{WARM_START_VARIABLE}={value!r}: expected on or off (or 1 or 0, true or false, yes or no)"
    )
