"""The rules the gate's settings keep beyond their component inputs' bounds, written once for every room.

A value is checked where it enters: a model's configuration file ([gate], components/model_config.py),
`--param` and the app setting RETRAIN_PIPELINE_PARAMETERS (components/local/plan.py), and the gate itself
(training/gate/policy.py, training/gate/options.py). A component YAML's `min`/`max` are Azure ML's own
check and inclusive only: a confidence of 1 passes `max: 1`, and would demand an interval no test set
can give, so it is refused here, in one line, before any data is pinned or any step started. So is a
confidence that the resample count (`bootstrap_resamples`, an evaluate input) can never support
(`resampling_conflict`): the resamples hold no value as low as the bound's quantile.

Standard library and core only, like the rest of core/: the Function App ships it too (.funcignore).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from core.errors import InputError
from core.train_rules import Rule, check_by_rules, read_number, read_optional_whole

CONFIDENCE = "confidence"
CONFIDENCE_EXPECTED = "a number between 0 and 1, exclusive, such as 0.95"
RESAMPLES = "bootstrap_resamples"
RESAMPLES_EXPECTED = "a whole number >= 1"
# The paired bootstrap's resamples when none are given: a 95% bound's 5% tail then holds 50 of them, the
# usual count for a percentile interval (Efron & Tibshirani, An Introduction to the Bootstrap, 1993, ch. 19),
# and few enough that scoring a small test set stays cheap.
DEFAULT_RESAMPLES = 1000
# 1 / (1 - confidence) is rounded down by this relative slack first: 1 - 0.95 is 0.050000000000000044 in
# floats, and 1 / (1 - 0.9999) is 10000.0000000011, which must need 9999 resamples, not 10000.
_SLACK = 1e-9
AS_FLAGS = ("--confidence", "--bootstrap-resamples")  # the two as the evaluate step's options name them


def _probability(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and 0.0 < value < 1.0


_RULES = (
    Rule(CONFIDENCE, CONFIDENCE_EXPECTED, read_number, _probability),
    # An optional input: unset (None, 'off') is the default count, which `resampling_conflict` reads.
    Rule(
        RESAMPLES,
        RESAMPLES_EXPECTED,
        read_optional_whole,
        lambda value: isinstance(value, int) and value >= 1,
    ),
)
GATE_RULES: Mapping[str, Rule] = MappingProxyType({rule.name: rule for rule in _RULES})


def minimum_resamples(confidence: float) -> int:
    """The fewest resamples from which a one-sided lower bound at `confidence` can be read.

    The bound is the alpha = (1 - confidence) quantile of the B resampled statistics. The k-th smallest of B
    draws lies, in expectation, at the k / (B + 1) quantile of the distribution they are drawn from (the B
    draws cut it into B + 1 parts of equal expected mass), so the alpha quantile is the ((B + 1) alpha)-th
    smallest, interpolated between its two neighbours when that is not whole (Davison & Hinkley, Bootstrap
    Methods and their Application, 1997, sec. 5.2; numpy's quantile method 'weibull'). It lies among the
    resamples only when (B + 1) alpha >= 1, that is B >= 1 / alpha - 1: 9 at 0.9, 19 at 0.95, 99 at 0.99.
    With fewer, even the smallest resample sits above the alpha quantile in expectation; any value read
    from them (the smallest, or a lone resample, which sits at the median) claims more than they show."""
    return max(1, math.ceil((1.0 - _SLACK) / (1.0 - confidence)) - 1)


def resampling_conflict(
    confidence: object, resamples: object, names: tuple[str, str] = (CONFIDENCE, RESAMPLES)
) -> str | None:
    """Why `resamples` paired resamples (None: the default count) can never give a bound at `confidence`,
    in one line naming both as `names` says and what to change; None when they can, when there is no
    confidence, or when a value is malformed (its own rule refuses it)."""
    if confidence is None or not GATE_RULES[CONFIDENCE].fits(confidence):
        return None
    if resamples is not None and not GATE_RULES[RESAMPLES].fits(resamples):
        return None
    level, given = read_number(confidence), read_optional_whole(resamples)
    count = DEFAULT_RESAMPLES if given is None else given
    needed = minimum_resamples(level)
    if count >= needed:
        return None
    default = " (the default)" if given is None else ""
    return (
        f"{names[0]} {level:g} with {names[1]} {count}{default}: a {level * 100:g}% lower bound is the "
        f"{(1.0 - level) * 100:g}% quantile of the resamples, which needs at least {needed} of them; "
        f"raise {names[1]} to {needed} or more, or lower {names[0]}"
    )


def check_gate_parameters(parameters: Mapping[str, object]) -> None:
    """Refuse, in one line naming it, the first gate parameter whose value the gate would refuse, then a
    confidence the resample count cannot support."""
    check_by_rules(parameters, GATE_RULES)
    conflict = resampling_conflict(parameters.get(CONFIDENCE), parameters.get(RESAMPLES))
    if conflict is not None:
        raise InputError(f"parameters: {conflict}")
