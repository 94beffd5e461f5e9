"""The metrics a task declares, the built-in tasks' own, and which metrics a gate policy may name.

Torch-free (the standard library and core/errors.py only), because three places read it: the task
contract (training/tasks/base.py re-exports `Metric` and `MetricSet`) and the built-in tasks, which take
their declarations from `BUILTIN_TASK_METRICS`; the gate (training/gate/policy.py), which refuses a policy
naming a metric its task does not report; and the front door, which checks every served model's policy
against its built-in task's declarations at start-up, without importing torch (function_app/settings/
gates.py). One declaration, read by the task classes and the start-up check alike, so they cannot disagree.
A user's task declares its metrics in its own file, which needs torch to import: its policy is checked by
the preflight (`python -m training.cli check-model`) instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Literal

from core.errors import InputError

Direction = Literal["higher", "lower"]
DIRECTIONS: tuple[Direction, ...] = ("higher", "lower")
FAMILY = "*"  # a metric or bound whose name ends in it covers every metric with that prefix (`recall_*`)
DEFAULT = "default"  # a gate option's value meaning: the task's default
BOUND_OPTIONS = ("floors", "max_regression", "first_model_floors")  # the policy's METRIC=NUMBER parts


@dataclass(frozen=True)
class Metric:
    """One score a task reports. `name` ending in `*` declares a family (`recall_*`); `per_class` says its
    members are one per class, named by the class's index (`recall_0`, `recall_3`): then no other name
    is one of them, and with the task's class count known, no index beyond it."""

    name: str
    direction: Direction
    description: str = ""
    per_class: bool = False

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise InputError(f"metric name {self.name!r}: expected a non-empty string")
        if self.direction not in DIRECTIONS:
            raise InputError(
                f"metric {self.name!r}: direction {self.direction!r}; expected 'higher' or 'lower'"
            )
        if self.per_class and not self.is_family:
            raise InputError(f"metric {self.name!r}: per_class needs a family, a name ending in {FAMILY!r}")

    @property
    def is_family(self) -> bool:
        return self.name.endswith(FAMILY)

    def covers(self, name: str) -> bool:
        if not self.is_family:
            return name == self.name
        return name.startswith(self.name[:-1]) and (not self.per_class or self.class_index(name) is not None)

    def class_index(self, name: str) -> int | None:
        """The class index a member of a per-class family names (`recall_3` -> 3); None for another name."""
        suffix = name[len(self.name) - 1 :]
        if not self.per_class or not name.startswith(self.name[:-1]) or not _CLASS_INDEX.fullmatch(suffix):
            return None
        return int(suffix)


_CLASS_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")  # as score() writes an index: no sign, no leading zeros


@dataclass(frozen=True)
class MetricSet:
    """The metrics a task declares; looks up directions, including family members such as `recall_3`.
    `class_count`, when the task's options or data fix it, bounds a per-class family's members: with 10
    classes, `recall_9` is one and `recall_10` is not (score() cannot report it)."""

    metrics: tuple[Metric, ...]
    class_count: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", tuple(self.metrics))
        if not self.metrics:
            raise InputError("a task must declare at least one metric")
        names = [metric.name for metric in self.metrics]
        if len(set(names)) != len(names):
            raise InputError(f"a task declares a metric twice: {sorted(names)}")
        count = self.class_count
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise InputError(f"class count {count!r}: expected a whole number >= 1")

    def with_class_count(self, count: int | None) -> MetricSet:
        """These metrics with the task's class count known (None: not known, no bound)."""
        return replace(self, class_count=count)

    @property
    def per_class(self) -> bool:
        """Whether a family of these metrics is per class (its members depend on the class count)."""
        return any(metric.per_class for metric in self.metrics)

    def find(self, name: str) -> Metric | None:
        exact = [metric for metric in self.metrics if metric.name == name]
        if exact:
            return exact[0]
        families = [
            metric
            for metric in self.metrics
            if metric.is_family and metric.covers(name) and self._within_classes(metric, name)
        ]
        return families[0] if families else None

    def per_class_member(self, name: str) -> Metric | None:
        """The per-class family `name` is a member of, whatever the class count; None otherwise."""
        return next((metric for metric in self.metrics if metric.class_index(name) is not None), None)

    def _within_classes(self, metric: Metric, name: str) -> bool:
        index = metric.class_index(name)
        return index is None or self.class_count is None or index < self.class_count

    def direction(self, name: str) -> Direction:
        metric = self.find(name)
        if metric is None:
            raise InputError(f"metric {name!r} is not one of this task's: {self.describe()}")
        return metric.direction

    def higher_is_better(self, name: str) -> bool:
        return self.direction(name) == "higher"

    def names(self) -> tuple[str, ...]:
        return tuple(metric.name for metric in self.metrics)

    def describe(self) -> str:
        return ", ".join(
            f"{metric.name} ({metric.direction} is better{self._members(metric)})" for metric in self.metrics
        )

    def _members(self, metric: Metric) -> str:
        if not metric.per_class or self.class_count is None:
            return ""
        prefix = metric.name[:-1]
        if self.class_count == 1:
            return f"; {prefix}0 for its 1 class"
        return f"; {prefix}0 to {prefix}{self.class_count - 1} for its {self.class_count} classes"


@dataclass(frozen=True)
class DeclaredMetrics:
    """What a task declares of its scores: its metrics and the one the gate compares by default."""

    metrics: MetricSet
    default_primary_metric: str

    def __post_init__(self) -> None:
        if self.metrics.find(self.default_primary_metric) is None:
            raise InputError(
                f"default primary metric {self.default_primary_metric!r}: expected one of "
                f"{self.metrics.describe()}"
            )


RECALL_PREFIX = "recall_"

# The built-in tasks' declarations (training/tasks/tabular, training/tasks/image read them from here).
BUILTIN_TASK_METRICS: Mapping[str, DeclaredMetrics] = MappingProxyType(
    {
        "tabular": DeclaredMetrics(
            MetricSet(
                (
                    Metric("accuracy", "higher", "share of rows whose predicted class is the label"),
                    Metric(
                        "macro_f1", "higher", "F1 averaged over the classes present in labels or predictions"
                    ),
                    Metric("loss", "lower", "mean cross-entropy"),
                    Metric(
                        f"{RECALL_PREFIX}*",
                        "higher",
                        "recall of one class, by its index (recall_3)",
                        per_class=True,
                    ),
                )
            ),
            "macro_f1",
        ),
        "image": DeclaredMetrics(
            MetricSet(
                (
                    Metric("accuracy", "higher", "the share of images classified right"),
                    Metric("macro_f1", "higher", "F1 averaged over the classes, each counting the same"),
                    Metric("loss", "lower", "mean cross-entropy"),
                    Metric(
                        f"{RECALL_PREFIX}*",
                        "higher",
                        "each class's recall, keyed by class index (recall_0, ...)",
                        per_class=True,
                    ),
                )
            ),
            "macro_f1",
        ),
    }
)


# The tabular task's with `objective = "regression"`: what it reports of a numeric target instead.
TABULAR_REGRESSION_METRICS = DeclaredMetrics(
    MetricSet(
        (
            Metric("rmse", "lower", "root mean squared error, in the target's units"),
            Metric("mae", "lower", "mean absolute error, in the target's units"),
            Metric("r2", "higher", "coefficient of determination: 1 - squared error / the target's variance"),
            Metric(
                "loss", "lower", "mean squared error of the standardised target (what training minimises)"
            ),
        )
    ),
    "rmse",
)


def builtin_declared(task: str, options: Mapping[str, Any]) -> DeclaredMetrics | None:
    """What a built-in task with these options declares (None for a user's task): the tabular task's
    metrics follow its `objective`."""
    if task == "tabular" and options.get("objective") == "regression":
        return TABULAR_REGRESSION_METRICS
    return BUILTIN_TASK_METRICS.get(task)


def builtin_class_count(task: str, options: Mapping[str, Any]) -> int | None:
    """The class count a built-in task's options fix, read without the task (the front door's start-up):
    the tabular task's `n_classes`, else the number of `classes` it names; None where only the data fixes
    it (the image task's class folders, the tabular task's labels) or for another task. The task itself
    reads its options by the same rule (training/tasks/tabular/schema.py) and checks them fully."""
    if task != "tabular":
        return None
    count, classes = options.get("n_classes"), options.get("classes")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        return count
    if isinstance(classes, list | tuple) and classes:
        return len(classes)
    return None


def parse_bounds(text: str, option: str) -> dict[str, float]:
    """`accuracy=0.9,loss=0.3` -> {'accuracy': 0.9, 'loss': 0.3}; '' or 'none' -> {}."""
    if text.strip().lower() in ("", "none"):
        return {}
    bounds: dict[str, float] = {}
    for part in text.split(","):
        name, separator, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not separator or not name.strip() or not math.isfinite(number):
            raise InputError(
                f"{option} {text!r}: expected METRIC=NUMBER[,METRIC=NUMBER...], e.g. accuracy=0.9"
            )
        bounds[name.strip()] = number
    return bounds


def check_policy_metrics(
    metrics: MetricSet, named: Iterable[tuple[str, str]], where: str = "the gate policy"
) -> None:
    """Refuse a policy part (`named`: (part, metric) pairs) naming a metric the task does not report, or a
    family as the primary metric: otherwise the gate would reject every candidate after a whole training,
    for a typo. One line naming where the policy came from, the part, the metric and the task's metrics."""
    for part, metric in named:
        if metrics.find(metric) is None:
            raise InputError(
                f"{where}: {part} names metric {metric!r}, which the task does not report; "
                f"expected one of {metrics.describe()}"
            )
        if part == "primary_metric" and metric.endswith(FAMILY):
            raise InputError(f"{where}: primary_metric {metric!r} is a family of metrics; name one metric")


def configured_metrics(parameters: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (part, metric) pairs a run's gate inputs name, as the register step reads them: the primary
    metric, and each bound's metric; a part unset or 'default' names none (the task's defaults name only
    metrics it reports). Malformed bounds raise InputError, as the register step would."""
    named: list[tuple[str, str]] = []
    primary = parameters.get("primary_metric")
    if isinstance(primary, str) and primary.strip() not in ("", DEFAULT):
        named.append(("primary_metric", primary.strip()))
    for part in BOUND_OPTIONS:
        text = parameters.get(part)
        if text is None or str(text).strip().lower() == DEFAULT:
            continue
        named += [(part, metric) for metric in parse_bounds(str(text), f"--{part.replace('_', '-')}")]
    return named
