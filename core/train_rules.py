"""The rules the trainer's parameters keep, written once for every room that checks them.

A value is checked where it enters: a model's configuration file and `--param` (components/model_config.py,
components/run_settings.py), the app setting RETRAIN_PIPELINE_PARAMETERS (function_app/wiring.py), the
pre-run check of every request (components/preflight.py), and the trainer itself (training/engine/config.py).
All of them ask the rule here, so a value the trainer would refuse is refused at the first of them, in one
line, before any data is pinned or any budget spent. The component YAMLs' `min` bounds are Azure ML's own
check, inclusive only (a learning rate of 0 passes it); the rules here are the trainer's.

A rule takes a value as a TOML file or a request types it (`0.003`, `"auto"`), or as text (`--param`, an
app setting, a command line); `expected` words the form it accepts, for the caller's one-line error.
Standard library and core.errors only, like the rest of core/: the Function App ships it too
(.funcignore).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeGuard

from core.errors import InputError
from core.metrics import Metric, MetricSet

# `--early-stopping-metric`: a metric as the trainer logs it, the task's name behind `validation_`.
VALIDATION_PREFIX = "validation_"
_VALIDATION_METRIC = re.compile(VALIDATION_PREFIX + r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
# `--candidate`: which weights a training writes as its model; `auto` is `best` with validation, else `last`.
CANDIDATE_AUTO, CANDIDATE_BEST, CANDIDATE_LAST = "auto", "best", "last"
CANDIDATES = (CANDIDATE_AUTO, CANDIDATE_BEST, CANDIDATE_LAST)

# `--checkpoint-every-seconds auto`: the trainer measures its own checkpoint cost at its first saves and
# takes Daly's optimum interval for that cost and `--mtbe-hours` (training/checkpoint/interval.py).
AUTO_INTERVAL = "auto"
OFF_WORDS = ("off", "none")  # an optional interval left unset
_WHOLE = re.compile(r"[+-]?[0-9]+")


def _whole(value: object) -> int:
    if isinstance(value, str) and _WHOLE.fullmatch(value.strip()):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(value)


def read_number(value: object) -> float:
    """A number, from a number or its text ('nan' and 'inf' read: the rules refuse them); ValueError
    otherwise (a bool is not one)."""
    if isinstance(value, str):
        return float(value)  # 'nan' and 'inf' read; the rules refuse them
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(value)


def _text(value: object) -> str:
    if isinstance(value, str):
        return value.strip()
    raise ValueError(value)


def _off(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in OFF_WORDS)


def read_optional_whole(value: object) -> int | None:
    return None if _off(value) else _whole(value)


def read_optional_count(value: object) -> int | None:
    """A cadence that may be off: a whole number, with 0 (or 'off') meaning off (None)."""
    count = read_optional_whole(value)
    return None if count == 0 else count


def read_optional_name(value: object) -> str | None:
    if _off(value):
        return None
    if not isinstance(value, str):
        raise ValueError(value)
    return value.strip()


def read_candidate(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(value)
    return value.strip().lower()


def read_interval(value: object) -> float | str | None:
    """A checkpoint interval: a number of seconds, 'auto', or 'off' (None); ValueError otherwise."""
    if _off(value):
        return None
    if isinstance(value, str) and value.strip().lower() == AUTO_INTERVAL:
        return AUTO_INTERVAL
    return read_number(value)


def read_optional_number(value: object) -> float | None:
    """A number, or 'off' (None); ValueError otherwise."""
    return None if _off(value) else read_number(value)


# `--precision`: full float32, bfloat16 autocast (CPU and CUDA), float16 autocast with a gradient scaler
# (CUDA only; the trainer refuses it on a CPU). Lightning's names, so users recognise them.
PRECISIONS = ("32", "bf16-mixed", "16-mixed")


# `--strategy`: how the ranks share the model (training/engine/strategy.py): DDP replicates it, FSDP
# shards it.
STRATEGY_DDP = "ddp"
STRATEGY_FSDP = "fsdp"
STRATEGIES = (STRATEGY_DDP, STRATEGY_FSDP)

# `--checkpoint-layout`: one file written by rank 0, or a shard written by every rank (FSDP's only layout);
# auto is sharded under FSDP, single under DDP.
CHECKPOINT_LAYOUTS = ("auto", "single", "sharded")


def read_precision(value: object) -> str:
    """A precision's name; a TOML `precision = 32` is the name "32"."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return value.strip()
    raise ValueError(value)


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, float) and math.isfinite(value)


@dataclass(frozen=True)
class Rule:
    """One parameter: how a value of it is read, and which read values the trainer accepts."""

    name: str
    expected: str
    read: Callable[[object], object]  # raises ValueError for a value of the wrong form
    accepts: Callable[[object], bool]

    @property
    def flag(self) -> str:
        """The trainer's option for it: `--learning-rate`."""
        return "--" + self.name.replace("_", "-")

    def fits(self, value: object) -> bool:
        try:
            return self.accepts(self.read(value))
        except (TypeError, ValueError, OverflowError):
            return False


def _at_least(low: int) -> Callable[[object], bool]:
    return lambda value: isinstance(value, int) and value >= low


_RULES = (
    Rule("epochs", "a whole number >= 1", _whole, _at_least(1)),
    Rule("seed", "a whole number >= 0", _whole, _at_least(0)),
    Rule("global_batch_size", "a whole number >= 1", _whole, _at_least(1)),
    Rule("learning_rate", "a number > 0", read_number, lambda value: _finite(value) and value > 0),
    Rule("weight_decay", "a number >= 0", read_number, lambda value: _finite(value) and value >= 0),
    Rule("warmup_steps", "a whole number >= 0", _whole, _at_least(0)),
    Rule(
        "grad_clip_norm",
        "a number > 0 (the largest gradient norm), or 'off'",
        read_optional_number,
        lambda value: value is None or (_finite(value) and value > 0),
    ),
    Rule(
        "accumulate_grad_batches",
        "a whole number >= 1 (micro-batches per optimizer step)",
        _whole,
        _at_least(1),
    ),
    Rule("precision", f"one of {', '.join(PRECISIONS)}", read_precision, lambda value: value in PRECISIONS),
    Rule("strategy", f"one of {', '.join(STRATEGIES)}", _text, lambda value: value in STRATEGIES),
    Rule(
        "checkpoint_every_steps",
        "a whole number >= 1, or 'off'",
        read_optional_whole,
        lambda value: value is None or _at_least(1)(value),
    ),
    Rule(
        "checkpoint_every_seconds",
        f"a number of seconds > 0, '{AUTO_INTERVAL}' (chosen from the measured checkpoint cost) or 'off'",
        read_interval,
        lambda value: value in (None, AUTO_INTERVAL) or (_finite(value) and value > 0),
    ),
    Rule("mtbe_hours", "a number of hours > 0", read_number, lambda value: _finite(value) and value > 0),
    Rule(
        "keep_checkpoints",
        "a whole number >= 2, so that a corrupt newest checkpoint still leaves one to resume from",
        _whole,
        _at_least(2),
    ),
    Rule(
        "validate_every_epochs",
        "a whole number of epochs >= 1, or 0 or 'off' for none",
        read_optional_count,
        lambda value: value is None or _at_least(1)(value),
    ),
    Rule(
        "validate_every_steps",
        "a whole number of steps >= 1, or 0 or 'off' for none",
        read_optional_count,
        lambda value: value is None or _at_least(1)(value),
    ),
    Rule(
        "early_stopping_metric",
        "validation_<one of the task's metrics>, such as validation_loss, or 'off'",
        read_optional_name,
        lambda value: value is None or (isinstance(value, str) and bool(_VALIDATION_METRIC.fullmatch(value))),
    ),
    Rule(
        "early_stopping_patience",
        "a whole number of validations >= 1",
        _whole,
        _at_least(1),
    ),
    Rule(
        "early_stopping_min_delta",
        "a number >= 0 (how much the metric must improve by to count)",
        read_number,
        lambda value: _finite(value) and value >= 0,
    ),
    Rule("candidate", f"one of {', '.join(CANDIDATES)}", read_candidate, lambda value: value in CANDIDATES),
)
TRAIN_RULES: Mapping[str, Rule] = MappingProxyType({rule.name: rule for rule in _RULES})


def _shown(value: object) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_by_rules(parameters: Mapping[str, object], rules: Mapping[str, Rule]) -> None:
    """Refuse, in one line naming it, the first parameter whose value its rule refuses; a parameter with
    no rule among `rules` is left to its own step."""
    for name, value in parameters.items():
        rule = rules.get(name)
        if rule is not None and not rule.fits(value):
            raise InputError(f"parameter {name} is {_shown(value)}; expected {rule.expected}")


def validation_metric(name: str, metrics: MetricSet, task_name: str) -> Metric:
    """The task's metric behind `validation_<metric>` (an early-stopping metric, as the trainer logs it);
    InputError, naming the task and the names it reports, when the task does not declare it. The trainer,
    its launcher and the pre-run check all ask here, so a metric is refused before anything trains."""
    found = metrics.find(name.removeprefix(VALIDATION_PREFIX)) if name.startswith(VALIDATION_PREFIX) else None
    if found is None:
        declared = ", ".join(VALIDATION_PREFIX + each for each in metrics.names())
        raise InputError(f"task {task_name!r} does not report it; expected one of {declared}")
    return found


def strategy_conflict(strategy: object, checkpoint_layout: object, precision: object) -> str | None:
    """Why a strategy cannot train with this checkpoint layout or precision, in one line; None if it can."""
    if strategy != STRATEGY_FSDP:
        return None
    if checkpoint_layout == "single":
        return (
            "checkpoint_layout single with strategy fsdp: no process holds the whole state; "
            "use sharded or auto"
        )
    if precision in ("16-mixed", "16"):
        return (
            "precision 16-mixed with strategy fsdp: its gradient scaler would find overflows in each rank's "
            "shard apart, and the ranks would skip different steps; use bf16-mixed or 32"
        )
    return None


def check_train_parameters(parameters: Mapping[str, object]) -> None:
    """Refuse, in one line naming it, the first parameter whose value the trainer would refuse, then a
    combination it would refuse."""
    check_by_rules(parameters, TRAIN_RULES)
    conflict = strategy_conflict(
        parameters.get("strategy"), parameters.get("checkpoint_layout"), str(parameters.get("precision"))
    )
    if conflict is not None:
        raise InputError(f"parameters: {conflict}")
