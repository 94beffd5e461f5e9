"""The rules the gate's settings keep beyond their component inputs' bounds, written once for every room.

A value is checked where it enters: a model's configuration file ([gate], components/model_config.py),
`--param` and the app setting RETRAIN_PIPELINE_PARAMETERS (components/local/plan.py), and the gate itself
(training/gate/policy.py, training/gate/options.py). A component YAML's `min`/`max` are Azure ML's own
check and inclusive only: a confidence of 1 passes `max: 1`, and would demand an interval no test set
can give, so it is refused here, in one line, before any data is pinned or any step started.

Standard library and core only, like the rest of core/: the Function App ships it too (.funcignore).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from core.train_rules import Rule, check_by_rules

CONFIDENCE = "confidence"
CONFIDENCE_EXPECTED = "a number between 0 and 1, exclusive, such as 0.95"


def _number(value: object) -> float:
    if isinstance(value, str):
        return float(value)  # 'nan' and 'inf' read; the rule refuses them
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(value)


def _probability(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and 0.0 < value < 1.0


_RULES = (Rule(CONFIDENCE, CONFIDENCE_EXPECTED, _number, _probability),)
GATE_RULES: Mapping[str, Rule] = MappingProxyType({rule.name: rule for rule in _RULES})


def check_gate_parameters(parameters: Mapping[str, object]) -> None:
    """Refuse, in one line naming it, the first gate parameter whose value the gate would refuse."""
    check_by_rules(parameters, GATE_RULES)
