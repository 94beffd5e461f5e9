"""Data drift between a model's reference data and newly arrived data: pure statistics over numpy arrays.

Two measures per feature, because each covers the other's blind spot:

- The population stability index (PSI) says how much the distribution moved. Bins come from the
  reference's quantiles (`bins` equal shares; repeated quantiles merge into one edge), plus one bin below
  the reference's minimum and one above its maximum, so values the reference never took count as
  movement. A reference that takes at most `bins` distinct values (a count, a flag, a one-hot category
  share) is binned by value instead: each value its own bin, with a bin for every gap between and beyond
  them. Quantile bins would put 0 and 1 of a flag into one bin [0, 1], blind to any change of its share.
  PSI = sum over bins of (c - r) * ln(c / r), with r and c the reference's and the current data's share
  of rows in the bin. An empty bin counts as holding a share of `EPSILON` (1e-4) rather than 0, which
  keeps the logarithm finite: a bin that only one side fills adds about share * ln(share / 1e-4), large
  but bounded. Shares are not renormalised after that floor.
- The two-sample Kolmogorov-Smirnov test says whether the move is more than sampling noise.

A feature has drifted when both agree: its PSI is above the policy's threshold (material) and the KS
p-value below the policy's (significant). On large samples a tiny, harmless shift is significant; on small
ones PSI is noisy; requiring both keeps either from raising alerts alone. An alert is raised when at least
`min_drifted_features` features drifted.

Missing values: NaN in a feature's column means the value is missing (infinity is refused). A feature's
PSI and KS compare the present (non-NaN) values of each side; when either side has a missing value, the
check adds the feature `NAME:missing`, each row's 0/1 missing indicator, compared like any flag (by value),
so a jump in the missing rate drifts like any other feature. A side with no present value of a feature has
no distribution to compare: that feature's value comparison is left out and `NAME:missing` (then certain
to be there) speaks for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import InputError

EPSILON = 1e-4
# Conventional PSI reading: below 0.1 stable, 0.1-0.2 a moderate shift, above 0.2 a significant one.
DEFAULT_PSI_THRESHOLD = 0.2
DEFAULT_KS_PVALUE = 0.01
DEFAULT_MIN_DRIFTED_FEATURES = 1
DEFAULT_BINS = 10
MAX_BINS = 100
MISSING = "missing"  # `NAME:missing`: the missing-value indicator, beside token shares' `NAME:other`


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class DriftPolicy:
    """When a feature counts as drifted, and how many drifted features raise an alert."""

    psi_threshold: float = DEFAULT_PSI_THRESHOLD
    ks_pvalue: float = DEFAULT_KS_PVALUE
    min_drifted_features: int = DEFAULT_MIN_DRIFTED_FEATURES
    bins: int = DEFAULT_BINS

    def __post_init__(self) -> None:
        if not _is_number(self.psi_threshold) or self.psi_threshold <= 0:
            raise InputError(f"--psi-threshold {self.psi_threshold!r}: expected a positive number, e.g. 0.2")
        if not _is_number(self.ks_pvalue) or not 0 < self.ks_pvalue < 1:
            raise InputError(
                f"--ks-pvalue {self.ks_pvalue!r}: expected a p-value between 0 and 1 (exclusive), e.g. 0.01"
            )
        if not _is_whole(self.min_drifted_features) or self.min_drifted_features < 1:
            raise InputError(
                f"--min-drifted-features {self.min_drifted_features!r}: expected a whole number of at least 1"
            )
        if not _is_whole(self.bins) or not 2 <= self.bins <= MAX_BINS:
            raise InputError(f"--bins {self.bins!r}: expected a whole number from 2 to {MAX_BINS}")

    def describe(self) -> dict[str, float | int]:
        return {
            "psi_threshold": self.psi_threshold,
            "ks_pvalue": self.ks_pvalue,
            "min_drifted_features": self.min_drifted_features,
            "bins": self.bins,
        }


@dataclass(frozen=True)
class FeatureDrift:
    """One feature's scores and verdict."""

    name: str
    psi: float
    ks_statistic: float
    ks_pvalue: float
    drifted: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "psi": self.psi,
            "ks_statistic": self.ks_statistic,
            "ks_pvalue": self.ks_pvalue,
            "drifted": self.drifted,
        }


@dataclass(frozen=True)
class DriftReport:
    """Every feature's scores, the verdict, and which data was compared with which."""

    policy: DriftPolicy
    features: tuple[FeatureDrift, ...]
    reference_rows: int
    current_rows: int
    reference_data_version: str | None = None
    current_data_version: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        if not self.features:
            raise InputError("a drift report needs at least one feature; expected feature scores")

    @property
    def drifted(self) -> tuple[str, ...]:
        return tuple(feature.name for feature in self.features if feature.drifted)

    @property
    def alert(self) -> bool:
        return len(self.drifted) >= self.policy.min_drifted_features

    @property
    def worst(self) -> FeatureDrift:
        """The feature with the largest PSI (the first of equals)."""
        return max(self.features, key=lambda feature: feature.psi)

    @property
    def max_psi(self) -> float:
        return self.worst.psi

    def summary(self) -> str:
        """One line: the verdict first, then the evidence."""
        verdict = "ALERT: drift detected" if self.alert else "no alert"
        worst = self.worst
        return (
            f"{verdict}: {len(self.drifted)} of {len(self.features)} features drifted "
            f"(alert at {self.policy.min_drifted_features}); max PSI {worst.psi:.4f} on {worst.name} "
            f"(threshold {self.policy.psi_threshold:g}), KS p-value {worst.ks_pvalue:.3g} "
            f"(threshold {self.policy.ks_pvalue:g})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "alert": self.alert,
            "drifted_features": list(self.drifted),
            "drifted_count": len(self.drifted),
            "worst_feature": self.worst.name,
            "max_psi": self.max_psi,
            "policy": self.policy.describe(),
            "reference": {"data_version": self.reference_data_version, "rows": self.reference_rows},
            "current": {"data_version": self.current_data_version, "rows": self.current_rows},
            "features": [feature.to_dict() for feature in self.features],
        }


# -- the measures ----------------------------------------------------------------------------------------


def quantile_edges(reference: np.ndarray, bins: int = DEFAULT_BINS) -> np.ndarray:
    """The distinct quantiles of `reference` at 0, 1/bins, ..., 1: its minimum, inner edges, maximum."""
    return np.unique(np.quantile(reference, np.linspace(0.0, 1.0, bins + 1)))


def bin_indices(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each value's bin: 0 below edges[0]; then [e0, e1], (e1, e2], ..., (e_k-1, e_k]; last, above e_k.

    With a single edge (a constant reference) the one inner bin holds exactly that value.
    """
    inner = max(len(edges) - 1, 1)
    position = np.clip(np.searchsorted(edges[1:], values, side="left"), 0, inner - 1) + 1
    return np.where(values < edges[0], 0, np.where(values > edges[-1], inner + 1, position))


def bin_shares(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The share of `values` in each bin of `edges`, an empty bin counting as `EPSILON`."""
    bins = max(len(edges) - 1, 1) + 2
    counts = np.bincount(bin_indices(values, edges), minlength=bins)
    return np.maximum(counts / len(values), EPSILON)


def level_indices(values: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Each value's bin among the sorted distinct `levels`: 0 below levels[0], 1 at it, 2 between it and
    levels[1], 3 at levels[1], ..., 2 x len(levels) above the last."""
    position = np.searchsorted(levels, values, side="left")
    at_level = levels[np.minimum(position, len(levels) - 1)] == values
    return 2 * position + at_level.astype(np.int64)


def level_shares(values: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The share of `values` in each bin of `levels`, an empty bin counting as `EPSILON`."""
    counts = np.bincount(level_indices(values, levels), minlength=2 * len(levels) + 1)
    return np.maximum(counts / len(values), EPSILON)


def population_stability_index(reference: np.ndarray, current: np.ndarray, bins: int = DEFAULT_BINS) -> float:
    """PSI of `current` against `reference` (one feature each), over the reference's quantile bins, or
    its values when it takes at most `bins` distinct ones."""
    reference, current = _column(reference, "reference"), _column(current, "current")
    levels = np.unique(reference)
    if len(levels) <= bins:
        expected, actual = level_shares(reference, levels), level_shares(current, levels)
    else:
        edges = quantile_edges(reference, bins)
        expected, actual = bin_shares(reference, edges), bin_shares(current, edges)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def ks_test(reference: np.ndarray, current: np.ndarray) -> tuple[float, float]:
    """(statistic, p-value) of the two-sample Kolmogorov-Smirnov test, two-sided."""
    from scipy.stats import ks_2samp  # scipy takes a second to import; only a drift check needs it

    result = ks_2samp(_column(reference, "reference"), _column(current, "current"))
    return float(result.statistic), float(result.pvalue)


def _column(values: np.ndarray, what: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise InputError(f"the {what} values have shape {array.shape}; expected a non-empty 1-D array")
    if not np.isfinite(array).all():
        # The measures take present values only; `compare` splits missing ones (NaN) off before them.
        raise InputError(f"the {what} values hold NaN or infinity; expected finite numbers")
    return array


# -- the check -------------------------------------------------------------------------------------------


def feature_drift(name: str, reference: np.ndarray, current: np.ndarray, policy: DriftPolicy) -> FeatureDrift:
    """One feature's scores and verdict over finite values (no missing ones: see `column_drift`)."""
    psi = population_stability_index(reference, current, policy.bins)
    statistic, pvalue = ks_test(reference, current)
    drifted = psi > policy.psi_threshold and pvalue < policy.ks_pvalue
    return FeatureDrift(name, psi, statistic, pvalue, drifted)


def missing_name(name: str) -> str:
    """The name of a feature's missing-value indicator."""
    return f"{name}:{MISSING}"


def column_drift(
    name: str, reference: np.ndarray, current: np.ndarray, policy: DriftPolicy
) -> tuple[FeatureDrift, ...]:
    """One column's comparison, NaN being a missing value: its present values (left out when a side has
    none), then `NAME:missing` when either side has a missing value. Always at least one of them."""
    reference_missing, current_missing = np.isnan(reference), np.isnan(current)
    scores: list[FeatureDrift] = []
    # A missing value has no place on the feature's scale, so the values compared are the present ones;
    # a side with none has no distribution to compare (PSI and KS need at least one value).
    if not reference_missing.all() and not current_missing.all():
        scores.append(feature_drift(name, reference[~reference_missing], current[~current_missing], policy))
    # Only with a missing value somewhere: data without any is reported with exactly the features it has.
    if reference_missing.any() or current_missing.any():
        # A 0/1 column takes at most two values, so PSI bins it by value and sees its share of 1s move.
        indicator = feature_drift(
            missing_name(name),
            reference_missing.astype(np.float64),
            current_missing.astype(np.float64),
            policy,
        )
        scores.append(indicator)
    return tuple(scores)


def compare(
    reference: np.ndarray,
    current: np.ndarray,
    feature_names: Sequence[str],
    policy: DriftPolicy | None = None,
    *,
    reference_data_version: str | None = None,
    current_data_version: str | None = None,
) -> DriftReport:
    """Compare two [rows, features] matrices column by column; columns are named by `feature_names`. NaN
    is a missing value: see the module's docstring for what is compared then."""
    policy = policy or DriftPolicy()
    names = list(feature_names)
    reference = _matrix(reference, "reference", names)
    current = _matrix(current, "current", names)
    has_missing = np.isnan(reference).any(axis=0) | np.isnan(current).any(axis=0)
    taken = set(names)
    for name in (name for name, missing in zip(names, has_missing, strict=True) if missing):
        if missing_name(name) in taken:
            # Two scores under one name would overwrite each other in the report's readers (MLflow, events).
            raise InputError(
                f"drift features: {missing_name(name)!r} is both a feature and the missing-value indicator "
                f"of {name!r}; rename the feature"
            )
    features = tuple(
        score
        for index, name in enumerate(names)
        for score in column_drift(name, reference[:, index], current[:, index], policy)
    )
    return DriftReport(
        policy=policy,
        features=features,
        reference_rows=len(reference),
        current_rows=len(current),
        reference_data_version=reference_data_version,
        current_data_version=current_data_version,
    )


def _matrix(values: np.ndarray, what: str, names: Sequence[str]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] != len(names) or array.shape[0] == 0:
        raise InputError(
            f"the {what} data has shape {array.shape}; expected at least one row of {len(names)} features"
        )
    infinite = np.isinf(array)
    if infinite.any():
        row, column = (int(index) for index in np.argwhere(infinite)[0])
        raise InputError(
            f"the {what} data holds {array[row, column]} in feature {names[column]!r} (row {row}); expected "
            "finite numbers, or NaN for a missing value"
        )
    return array
