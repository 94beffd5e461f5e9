"""The registration gate: (candidate scores, champion scores, policy) -> a decision with its reasons. Pure.

It fails closed. A missing or non-finite metric, scores computed on different data versions, or a champion
that cannot be loaded are rejections with a reason, never a pass by default. The only way past an
unloadable champion is a configured bootstrap, which then holds the candidate to the first-model floors.

With a `confidence`, the margin is held with that confidence rather than by the point estimate alone: the
evaluation scored both models on the same resamples of the test split (training/gate/bootstrap.py), and
the candidate passes only when the one-sided lower bound of the improvement's bootstrap distribution is
above `min_improvement`. The resamples and their seed are recorded, so the same evidence decides the same.
Evidence too thin to read a bound from certifies nothing: fewer test rows than MIN_TEST_ROWS, or fewer
resamples than the confidence's quantile needs (core/gate_rules.minimum_resamples), is a rejection that
says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from core.errors import InputError
from core.gate_rules import AS_FLAGS, CONFIDENCE, GATE_RULES, minimum_resamples, resampling_conflict
from core.metrics import DEFAULT, FAMILY, MetricSet, check_policy_metrics, parse_bounds

if TYPE_CHECKING:
    from training.tasks.base import Task

ALL_RECALLS = "recall_*"  # in max_regression: every per-class recall
# The fewest test rows from which a paired bootstrap certifies a margin. The bootstrap takes the rows for
# the population, so a small split understates the spread (the resampled variance is (n - 1) / n of the
# sample's) and cannot show what it lacks. Even for the kindest statistic, the mean of normally distributed
# values, the one-sided 95% percentile bound misses the truth in 15.6% of samples of 3 rows, 7.6% of 10 and
# 5.8% of 30 (P(T with n - 1 degrees of freedom > z_0.95 * sqrt((n - 1) / n))); from 30 rows on the miss rate
# stays within about a fifth of the nominal 5%. A metric of n rows also moves in steps of 1/n.
MIN_TEST_ROWS = 30


def non_finite(metrics: Mapping[str, Any]) -> list[str]:
    """Names of metrics whose value is NaN, infinite or not a number at all."""
    bad = []
    for name, value in metrics.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            bad.append(name)
    return sorted(bad)


def _format_bounds(bounds: Mapping[str, float]) -> str:
    return ",".join(f"{name}={value:g}" for name, value in bounds.items()) or "none"


@dataclass(frozen=True)
class GatePolicy:
    """What a candidate must show to enter the registry. Directions come from the task's metrics.

    - `primary_metric` must beat the champion's by at least `min_improvement` (absolute);
    - `floors` bound every candidate (a minimum, or for a lower-is-better metric such as loss a maximum);
    - `max_regression` bounds how much worse than the champion any secondary metric may get
      (a name ending in `*` covers a family: `recall_*` is every per-class recall);
    - `first_model_floors` is what the first model must meet when there is no champion;
    - `bootstrap_unloadable_champion` lets a candidate replace a champion that cannot be loaded, held to
      the first-model floors. Off by default: an unreadable champion blocks registration until fixed.
    - `confidence` (0 < c < 1), when set, holds the margin with that confidence: the lower bound of the
      improvement's paired bootstrap distribution must be above `min_improvement`. None (the default):
      the margin applies to the improvement measured on the whole test split, as it is. It never applies
      to a first model, which has no champion to be compared with.

    The defaults here are a classifier's (accuracy, macro-F1, per-class recall): the built-in tabular and
    image tasks'. `policy_for_task` keeps only those a task reports, so a regression task gets its own
    primary metric and no bounds unless they are configured.
    """

    primary_metric: str = "macro_f1"
    min_improvement: float = 0.002
    floors: Mapping[str, float] = field(default_factory=lambda: {"accuracy": 0.8})
    max_regression: Mapping[str, float] = field(default_factory=lambda: {"accuracy": 0.01, ALL_RECALLS: 0.1})
    first_model_floors: Mapping[str, float] = field(
        default_factory=lambda: {"accuracy": 0.9, "macro_f1": 0.9}
    )
    bootstrap_unloadable_champion: bool = False
    confidence: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.primary_metric, str) or not self.primary_metric.strip():
            raise InputError(
                f"--primary-metric {self.primary_metric!r}: expected the name of one of the task's metrics"
            )
        if self.primary_metric.endswith(FAMILY):
            raise InputError(
                f"--primary-metric {self.primary_metric!r}: a family of metrics; name one metric"
            )
        if not math.isfinite(self.min_improvement) or self.min_improvement < 0:
            raise InputError(f"--min-improvement {self.min_improvement}: expected a number >= 0")
        negative = sorted(name for name, value in self.max_regression.items() if value < 0)
        if negative:
            raise InputError(f"--max-regression {negative}: expected allowances >= 0 (how much worse may be)")
        rule = GATE_RULES[CONFIDENCE]
        if self.confidence is not None and not rule.fits(self.confidence):
            raise InputError(f"--confidence {self.confidence!r}: expected {rule.expected}")
        for name in ("floors", "max_regression", "first_model_floors"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @classmethod
    def from_options(
        cls,
        primary_metric: str,
        min_improvement: float,
        floors: str,
        max_regression: str,
        first_model_floors: str,
        bootstrap_unloadable_champion: bool = False,
        confidence: float | None = None,
    ) -> GatePolicy:
        return cls(
            primary_metric=primary_metric,
            min_improvement=min_improvement,
            floors=parse_bounds(floors, "--floors"),
            max_regression=parse_bounds(max_regression, "--max-regression"),
            first_model_floors=parse_bounds(first_model_floors, "--first-model-floors"),
            bootstrap_unloadable_champion=bootstrap_unloadable_champion,
            confidence=confidence,
        )

    def describe(self) -> dict[str, str]:
        """The policy as text, for records and tags; `confidence` only when set, so a policy without one
        is described as it always was."""
        described = {
            "primary_metric": self.primary_metric,
            "min_improvement": f"{self.min_improvement:g}",
            "floors": _format_bounds(self.floors),
            "max_regression": _format_bounds(self.max_regression),
            "first_model_floors": _format_bounds(self.first_model_floors),
            "bootstrap_unloadable_champion": str(self.bootstrap_unloadable_champion).lower(),
        }
        if self.confidence is not None:
            described[CONFIDENCE] = f"{self.confidence:g}"
        return described


@dataclass(frozen=True)
class Scored:
    """A model's scores, and exactly what they were computed on."""

    metrics: Mapping[str, float]
    data_version: str
    weights_sha256: str


NO_CHAMPION, LOADED, UNLOADABLE = "none", "loaded", "unloadable"


@dataclass(frozen=True)
class PairedScores:
    """One metric of the candidate and of the champion on the same resamples of the test split: resample
    `i` is the same rows for both (training/gate/bootstrap.py draws them from `seed`); `rows`: the split's
    size, each resample's."""

    metric: str
    seed: int
    candidate: tuple[float, ...]
    champion: tuple[float, ...]
    rows: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidate", tuple(float(value) for value in self.candidate))
        object.__setattr__(self, "champion", tuple(float(value) for value in self.champion))
        if not self.candidate or len(self.candidate) != len(self.champion):
            raise ValueError(
                f"paired scores of {self.metric}: {len(self.candidate)} candidate and {len(self.champion)} "
                "champion values; expected as many of each, at least one"
            )
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 1:
            raise ValueError(
                f"paired scores of {self.metric} on {self.rows!r} rows; expected a whole number >= 1"
            )

    @property
    def resamples(self) -> int:
        return len(self.candidate)


@dataclass(frozen=True)
class Interval:
    """The primary metric's improvement over the champion (in its better direction; on the whole split)
    and the one-sided lower bound of its paired bootstrap distribution at `confidence`. `non_finite`:
    resamples on which a model had no finite score; any makes the bound NaN, which passes nothing."""

    metric: str
    confidence: float
    resamples: int
    seed: int
    improvement: float
    lower_bound: float
    non_finite: int = 0

    @property
    def bound_text(self) -> str:
        return f"{self.confidence * 100:g}% interval lower bound {self.lower_bound:+.4f}"

    @property
    def basis_text(self) -> str:
        unusable = f"; {self.non_finite} without a finite {self.metric}" if self.non_finite else ""
        return f"({self.resamples} paired resamples, seed {self.seed}{unusable})"


def lower_bound(improvements: Sequence[float], confidence: float) -> float:
    """The one-sided lower bound at `confidence` of a bootstrap distribution: its alpha = (1 - confidence)
    quantile, the ((B + 1) alpha)-th smallest of the B values, interpolated between its two neighbours when
    that is not whole (numpy's quantile method 'weibull'; core/gate_rules.minimum_resamples says why). It is
    always one of the values or between two adjacent ones, never outside their range. ValueError for fewer
    values than the confidence needs, whose smallest already lies above the quantile. NaN if any value is
    not finite: a bound that cannot be trusted passes nothing."""
    count, needed = len(improvements), minimum_resamples(confidence)
    if count < needed:
        raise ValueError(
            f"{count} resampled improvements; a {confidence * 100:g}% bound needs at least {needed}"
        )
    if not all(math.isfinite(value) for value in improvements):
        return math.nan
    ordered = sorted(improvements)
    # 1-based; rounded, so that a whole position (20 * 0.05) is not a hair off it in floats.
    position = min(max(round((count + 1) * (1.0 - confidence), 9), 1.0), float(count))
    below = math.floor(position)
    low, high = ordered[below - 1], ordered[min(below, count - 1)]
    return min(max(low + (high - low) * (position - below), low), high)


def improvement_interval(
    paired: PairedScores, higher_is_better: bool, confidence: float, improvement: float
) -> Interval:
    """The paired bootstrap's interval: each resample's improvement is the candidate's score minus the
    champion's on the same rows (the other way round for a lower-is-better metric), and the bound is the
    (1 - confidence) quantile of those improvements. `improvement` is the one on the whole split."""
    pairs = zip(paired.candidate, paired.champion, strict=True)
    improvements = [mine - theirs if higher_is_better else theirs - mine for mine, theirs in pairs]
    return Interval(
        metric=paired.metric,
        confidence=confidence,
        resamples=paired.resamples,
        seed=paired.seed,
        improvement=improvement,
        lower_bound=lower_bound(improvements, confidence),
        non_finite=sum(not math.isfinite(value) for value in improvements),
    )


def bootstrap_shortfall(paired: PairedScores, confidence: float) -> str | None:
    """Why `paired` is too thin to read a bound at `confidence` from, in one line with what to change: a
    test split of fewer than MIN_TEST_ROWS rows, or fewer resamples than the bound's quantile needs. None
    when a bound can be read."""
    if paired.rows < MIN_TEST_ROWS:
        return (
            f"the test split has {paired.rows} rows, fewer than the {MIN_TEST_ROWS} a paired bootstrap "
            "needs; evaluate on a larger test split, or gate without --confidence"
        )
    return resampling_conflict(confidence, paired.resamples, AS_FLAGS)


@dataclass(frozen=True)
class Champion:
    state: str
    version: str | None = None
    scored: Scored | None = None
    error: str | None = None

    @classmethod
    def none(cls) -> Champion:
        return cls(NO_CHAMPION)

    @classmethod
    def loaded(cls, version: str, scored: Scored) -> Champion:
        return cls(LOADED, version, scored)

    @classmethod
    def unloadable(cls, version: str, error: str) -> Champion:
        return cls(UNLOADABLE, version, error=error)


@dataclass(frozen=True)
class Decision:
    accepted: bool
    reasons: tuple[str, ...]
    primary_metric: str
    candidate_value: float | None
    champion_value: float | None
    champion_version: str | None
    interval: Interval | None = None  # with a confidence, against a loaded champion

    def to_dict(self) -> dict[str, Any]:
        """The decision as a record; `interval` only when there is one, so a decision taken without a
        confidence is recorded as it always was."""
        record = {**asdict(self), "reasons": list(self.reasons)}
        if self.interval is None:
            del record["interval"]
        return record

    @property
    def summary(self) -> str:
        return ("accepted: " if self.accepted else "rejected: ") + "; ".join(self.reasons)


def _worse_by(metrics: MetricSet, metric: str, candidate: float, champion: float) -> float:
    """How much worse the candidate is (positive) or better (negative), in the metric's direction."""
    return champion - candidate if metrics.higher_is_better(metric) else candidate - champion


def _expand(bounds: Mapping[str, float], present: Mapping[str, float]) -> dict[str, float]:
    """Bounds with each family (`recall_*`) replaced by the members `present` has; a named metric wins
    over its family's bound."""
    named = {name: value for name, value in bounds.items() if not name.endswith(FAMILY)}
    for family, value in bounds.items():
        if family.endswith(FAMILY):
            for name in present:
                if name.startswith(family[:-1]):
                    named.setdefault(name, value)
    return named


def _bound_violations(
    metrics: MetricSet, scores: Mapping[str, float], bounds: Mapping[str, float], label: str
) -> list[str]:
    reasons = []
    for metric, bound in _expand(bounds, scores).items():
        value = scores[metric]
        if non_finite({metric: value}):  # a family member; named metrics were checked before
            reasons.append(f"{metric} is not a finite number, so it cannot meet the {label} {bound:g}")
        elif metrics.higher_is_better(metric) and value < bound:
            reasons.append(f"{metric} {value:.4f} is below the {label} {bound:g}")
        elif not metrics.higher_is_better(metric) and value > bound:
            reasons.append(f"{metric} {value:.4f} is above the {label} {bound:g}")
    return reasons


def _required_metrics(policy: GatePolicy, against_champion: bool) -> set[str]:
    names = {policy.primary_metric, *policy.floors, *policy.first_model_floors}
    if against_champion:
        names |= set(policy.max_regression)
    return {name for name in names if not name.endswith(FAMILY)}  # a family has no member it must have


def _unusable(scores: Mapping[str, float], required: set[str], whose: str) -> list[str]:
    missing = sorted(required - set(scores))
    bad = non_finite({name: scores[name] for name in required & set(scores)})
    reasons = [f"{whose} has no {name}" for name in missing]
    return reasons + [f"{whose}'s {name} is not a finite number" for name in bad]


def _regressions(
    metrics: MetricSet, candidate: Mapping[str, float], champion: Mapping[str, float], policy: GatePolicy
) -> list[str]:
    reasons = []
    for metric, allowed in sorted(_expand(policy.max_regression, champion).items()):
        if metric == policy.primary_metric:
            continue
        if metric not in candidate or not math.isfinite(candidate[metric]):
            reasons.append(f"candidate has no usable {metric} to compare with the champion's")
            continue
        if metric not in champion or not math.isfinite(champion[metric]):
            continue  # nothing to regress from: a champion scored before the metric existed
        worse = _worse_by(metrics, metric, candidate[metric], champion[metric])
        if worse > allowed:
            reasons.append(
                f"{metric} regresses by {worse:.4f} against the champion; at most {allowed:g} allowed"
            )
    return reasons


def _margin_reasons(
    metrics: MetricSet,
    candidate: Scored,
    theirs: Scored,
    version: str | None,
    policy: GatePolicy,
    paired: PairedScores | None,
) -> tuple[list[str], Interval | None]:
    """Why the primary metric misses the margin, if it does, and the interval it was held to: without a
    confidence, by the improvement on the whole split alone; with one, by the lower bound of the paired
    bootstrap's improvements (and the whole split's improvement too, so a confidence only ever adds)."""
    metric, margin = policy.primary_metric, policy.min_improvement
    # How much worse the champion is than the candidate; for a tie +0.0, where negating would print -0.0.
    improvement = _worse_by(metrics, metric, theirs.metrics[metric], candidate.metrics[metric])
    if policy.confidence is None:
        if improvement <= 0 or improvement < margin:
            return [
                f"{metric} {candidate.metrics[metric]:.4f} does not beat champion v{version}'s "
                f"{theirs.metrics[metric]:.4f} by the margin {margin:g} (improvement {improvement:+.4f})"
            ], None
        return [], None
    if paired is None or paired.metric != metric:
        return [
            f"{metric}: no paired bootstrap of it against champion v{version}, so the margin {margin:g} "
            f"cannot be held with confidence {policy.confidence:g}; evaluate with --confidence"
        ], None
    shortfall = bootstrap_shortfall(paired, policy.confidence)
    if shortfall is not None:
        return [
            f"{metric}: the margin {margin:g} over champion v{version} is not certified: {shortfall}"
        ], None
    interval = improvement_interval(paired, metrics.higher_is_better(metric), policy.confidence, improvement)
    if not interval.lower_bound > margin:  # a NaN bound is not above it either
        return [
            f"{metric} improvement {improvement:+.4f} over champion v{version}, {interval.bound_text} "
            f"<= min_improvement {margin:g} {interval.basis_text}"
        ], interval
    if improvement <= 0 or improvement < margin:
        return [
            f"{metric} improvement {improvement:+.4f} over champion v{version} is below min_improvement "
            f"{margin:g}, though its {interval.bound_text} {interval.basis_text}"
        ], interval
    return [], interval


def _against_champion(
    metrics: MetricSet,
    candidate: Scored,
    theirs: Scored,
    version: str | None,
    policy: GatePolicy,
    paired: PairedScores | None,
) -> tuple[list[str], Interval | None]:
    if theirs.data_version != candidate.data_version:
        return [
            f"champion v{version} was scored on {theirs.data_version}, the candidate on "
            f"{candidate.data_version}; scores on different data are not comparable"
        ], None
    unusable = _unusable(theirs.metrics, {policy.primary_metric}, f"champion v{version}")
    if unusable:
        return unusable, None
    reasons, interval = _margin_reasons(metrics, candidate, theirs, version, policy, paired)
    return reasons + _regressions(metrics, candidate.metrics, theirs.metrics, policy), interval


def _rejections(
    metrics: MetricSet, candidate: Scored, champion: Champion, policy: GatePolicy, paired: PairedScores | None
) -> tuple[list[str], Interval | None]:
    required = _required_metrics(policy, champion.state == LOADED)
    unusable = _unusable(candidate.metrics, required, "candidate")
    if unusable:
        return unusable, None
    reasons = _bound_violations(metrics, candidate.metrics, policy.floors, "floor")
    if champion.state == LOADED and champion.scored is not None:
        against, interval = _against_champion(
            metrics, candidate, champion.scored, champion.version, policy, paired
        )
        return reasons + against, interval
    if champion.state == UNLOADABLE and not policy.bootstrap_unloadable_champion:
        return [
            *reasons,
            f"champion v{champion.version} cannot be loaded ({champion.error}); fix it, or allow a bootstrap",
        ], None
    # No champion to compare with (or a bootstrap over an unloadable one): the first-model floors, and no
    # confidence, which is about an improvement over a champion.
    return reasons + _bound_violations(
        metrics, candidate.metrics, policy.first_model_floors, "first-model floor"
    ), None


def _acceptance_reasons(
    candidate: Scored, champion: Champion, policy: GatePolicy, interval: Interval | None
) -> list[str]:
    metric = policy.primary_metric
    if champion.state == LOADED and champion.scored is not None:
        beats = (
            f"{metric} {candidate.metrics[metric]:.4f} beats champion v{champion.version}'s "
            f"{champion.scored.metrics[metric]:.4f}"
        )
        if interval is not None:
            return [
                f"{beats} on {candidate.data_version}: improvement {interval.improvement:+.4f}, "
                f"{interval.bound_text} > min_improvement {policy.min_improvement:g} {interval.basis_text}"
            ]
        return [f"{beats} by at least {policy.min_improvement:g} on {candidate.data_version}"]
    if champion.state == UNLOADABLE:
        return [f"bootstrap over unloadable champion v{champion.version}; first-model floors met"]
    return ["no champion yet; first-model floors met"]


def decide(
    candidate: Scored,
    champion: Champion,
    policy: GatePolicy,
    metrics: MetricSet,
    paired: PairedScores | None = None,
) -> Decision:
    """The gate's decision. `metrics` (the task's) says which way each metric is better; the policy must
    name only metrics it declares (`validate_policy_metrics`, which `policy_for_task` applies). `paired`:
    the primary metric of both models on the same resamples, which a policy with a confidence needs
    against a loaded champion (without it, such a candidate is refused)."""
    reasons, interval = _rejections(metrics, candidate, champion, policy, paired)
    accepted = not reasons
    if accepted:
        reasons = _acceptance_reasons(candidate, champion, policy, interval)
    metric = policy.primary_metric
    theirs = champion.scored.metrics if champion.scored is not None else {}
    return Decision(
        accepted=accepted,
        reasons=tuple(reasons),
        primary_metric=metric,
        candidate_value=candidate.metrics.get(metric),
        champion_value=theirs.get(metric),
        champion_version=champion.version,
        interval=interval,
    )


def validate_policy_metrics(policy: GatePolicy, metrics: MetricSet, where: str = "the gate policy") -> None:
    """Refuse a policy that names a metric the task does not report, before any step runs: otherwise the
    gate would reject every candidate after a whole training, for a typo."""
    named = [
        ("primary_metric", policy.primary_metric),
        *(("floors", name) for name in policy.floors),
        *(("max_regression", name) for name in policy.max_regression),
        *(("first_model_floors", name) for name in policy.first_model_floors),
    ]
    check_policy_metrics(metrics, named, where)


Bounds = str | Mapping[str, float] | None


def task_defaults(metrics: MetricSet, default_primary_metric: str) -> GatePolicy:
    """The policy a task gets when nothing is configured: its own primary metric, and of the classifier
    defaults (GatePolicy's) only the bounds on metrics it reports. A regression task reporting `mse` gets
    `mse` as its primary metric and no floors or regression allowances."""
    classifier = GatePolicy()

    def reported(bounds: Mapping[str, float]) -> dict[str, float]:
        return {name: value for name, value in bounds.items() if metrics.find(name) is not None}

    return GatePolicy(
        primary_metric=default_primary_metric,
        min_improvement=classifier.min_improvement,
        floors=reported(classifier.floors),
        max_regression=reported(classifier.max_regression),
        first_model_floors=reported(classifier.first_model_floors),
    )


def _bounds(given: Bounds, default: Mapping[str, float], option: str) -> Mapping[str, float]:
    if given is None or (isinstance(given, str) and given.strip().lower() == DEFAULT):
        return default
    return parse_bounds(given, option) if isinstance(given, str) else dict(given)


def policy_for_task(
    metrics: MetricSet,
    default_primary_metric: str,
    *,
    primary_metric: str | None = None,
    min_improvement: float | None = None,
    floors: Bounds = None,
    max_regression: Bounds = None,
    first_model_floors: Bounds = None,
    bootstrap_unloadable_champion: bool = False,
    confidence: float | None = None,
    where: str = "the gate policy",
) -> GatePolicy:
    """The gate policy for a task: each value given (None or 'default': the task's default), checked
    against the task's metrics. Bounds are mappings or option text (`accuracy=0.9,loss=0.3`, 'none')."""
    defaults = task_defaults(metrics, default_primary_metric)
    primary = primary_metric.strip() if isinstance(primary_metric, str) else primary_metric
    policy = GatePolicy(
        primary_metric=defaults.primary_metric if primary in (None, "", DEFAULT) else primary,
        min_improvement=defaults.min_improvement if min_improvement is None else float(min_improvement),
        floors=_bounds(floors, defaults.floors, "--floors"),
        max_regression=_bounds(max_regression, defaults.max_regression, "--max-regression"),
        first_model_floors=_bounds(first_model_floors, defaults.first_model_floors, "--first-model-floors"),
        bootstrap_unloadable_champion=bootstrap_unloadable_champion,
        confidence=None if confidence is None else float(confidence),
    )
    validate_policy_metrics(policy, metrics, where)
    return policy


def policy_of(task: Task, **given: Any) -> GatePolicy:
    """`policy_for_task` with the metrics and default primary metric of `task`."""
    return policy_for_task(task.metrics, task.default_primary_metric, **given)
