"""The paired bootstrap behind the gate's confidence: the bound as a pure function (always among the
resamples, and none from too few of them), the decision it makes (nothing certified from too few test rows
or resamples), and resampling (the same rows for both models, from the seed alone) for a TensorSplit and any
other map-style split, scored through the task's own `score`."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from helpers.training.regression_task import RegressionTask

from core.errors import InputError
from core.gate_rules import minimum_resamples
from training.gate import policy as gate
from training.gate.bootstrap import (
    ResampledSplit,
    Resampling,
    paired_document,
    paired_from_document,
    resample_indices,
    resampled,
    resampled_scores,
)
from training.gate.policy import (
    MIN_TEST_ROWS,
    Champion,
    GatePolicy,
    Interval,
    PairedScores,
    Scored,
    improvement_interval,
    lower_bound,
)
from training.tasks.base import Metric, MetricSet, TensorSplit

DATA = "dv-0123456789abcdef"
METRICS = MetricSet((Metric("macro_f1", "higher"), Metric("mse", "lower")))


def policy(**changes) -> GatePolicy:
    """A policy on macro_f1 alone: no floors or regression allowances to meet besides the margin."""
    bare = {"floors": {}, "max_regression": {}, "first_model_floors": {}}
    return GatePolicy(**{"primary_metric": "macro_f1", **bare, **changes})


CONFIDENT = policy(confidence=0.95)


def scored(macro_f1: float) -> Scored:
    return Scored({"macro_f1": macro_f1}, DATA, "a" * 64)


def champion(macro_f1: float) -> Champion:
    return Champion.loaded("3", Scored({"macro_f1": macro_f1}, DATA, "c" * 64))


def paired(
    candidate, champion_values, metric: str = "macro_f1", seed: int = 0, rows: int = 188
) -> PairedScores:
    return PairedScores(metric, seed, tuple(candidate), tuple(champion_values), rows)


# -- the bound ------------------------------------------------------------------------------------------


def test_the_lower_bound_is_the_b_plus_1_alpha_th_smallest_interpolated_between_neighbours():
    improvements = [0.05, -0.01, 0.03, 0.00, 0.01]  # sorted: -0.01, 0.00, 0.01, 0.03, 0.05
    assert lower_bound(improvements, 0.5) == pytest.approx(0.01)  # the 3rd of 5: the median
    assert lower_bound(improvements, 0.75) == pytest.approx(-0.01 + 0.01 * 0.5)  # the 1.5th
    assert lower_bound(list(range(1, 20)), 0.95) == 1  # the 1st of 19: 20 * 0.05 is whole
    assert lower_bound(list(range(1, 1000)), 0.95) == 50  # the 50th of 999
    assert lower_bound(list(range(1, 1001)), 0.95) == pytest.approx(50.05)  # between the 50th and 51st


def test_the_bound_never_lies_outside_the_resamples():
    chance = random.Random(11)
    for _ in range(300):
        confidence = chance.choice([0.5, 0.8, 0.9, 0.95, 0.975, 0.99])
        count = chance.randint(minimum_resamples(confidence), 400)
        values = [chance.lognormvariate(0, 2) - chance.random() for _ in range(count)]  # skewed
        bound = lower_bound(values, confidence)
        assert min(values) <= bound <= max(values)
        assert bound == pytest.approx(float(np.quantile(values, 1 - confidence, method="weibull")))


@pytest.mark.parametrize(("confidence", "fewest"), [(0.5, 1), (0.9, 9), (0.95, 19), (0.99, 99)])
def test_from_fewer_resamples_than_the_quantile_needs_there_is_no_bound(confidence, fewest):
    # With B resamples the smallest sits at the 1/(B+1) quantile: B must reach 1/alpha - 1 for the
    # alpha quantile to be among them. At the fewest, the bound is the smallest resample.
    assert minimum_resamples(confidence) == fewest
    values = [0.3 + index for index in range(fewest)][::-1]
    assert lower_bound(values, confidence) == 0.3
    with pytest.raises(ValueError, match=f"^{fewest - 1} resampled improvements; .* at least {fewest}$"):
        lower_bound(values[1:], confidence)


def test_a_value_that_is_not_finite_leaves_no_bound():
    assert math.isnan(lower_bound([0.1, math.nan, 0.2], 0.5))
    interval = improvement_interval(paired([0.9, math.nan] * 10, [0.8, 0.8] * 10), True, 0.95, 0.1)
    assert math.isnan(interval.lower_bound) and interval.non_finite == 10


def test_each_resample_s_improvement_is_read_in_the_metric_s_direction():
    # mse is lower-is-better: the candidate's 0.2 against the champion's 0.3 is an improvement of +0.1.
    lower = improvement_interval(paired([0.2] * 9, [0.3] * 9, "mse"), False, 0.9, 0.1)
    higher = improvement_interval(paired([0.2] * 9, [0.3] * 9), True, 0.9, -0.1)
    assert lower.lower_bound == pytest.approx(0.1)
    assert higher.lower_bound == pytest.approx(-0.1)


def test_paired_scores_must_be_as_many_for_both_models():
    with pytest.raises(ValueError, match="3 candidate and 2 champion values"):
        paired([0.1, 0.2, 0.3], [0.1, 0.2])
    with pytest.raises(ValueError, match="at least one"):
        paired([], [])
    with pytest.raises(ValueError, match="on 0 rows; expected a whole number >= 1"):
        paired([0.1], [0.1], rows=0)


# -- the decision ---------------------------------------------------------------------------------------


def test_identical_models_have_an_interval_at_zero_and_are_refused_naming_it():
    same = [0.91, 0.93, 0.90, 0.94] * 5
    decision = gate.decide(scored(0.92), champion(0.92), CONFIDENT, METRICS, paired(same, same, seed=4))
    assert not decision.accepted
    assert decision.interval == Interval("macro_f1", 0.95, 20, 4, 0.0, 0.0)
    assert decision.reasons == (
        "macro_f1 improvement +0.0000 over champion v3, 95% interval lower bound +0.0000 <= min_improvement "
        "0.002 (20 paired resamples, seed 4)",
    )
    # Even with no margin at all: a bound at zero is no evidence of an improvement.
    no_margin = policy(min_improvement=0.0, confidence=0.95)
    assert not gate.decide(scored(0.92), champion(0.92), no_margin, METRICS, paired(same, same)).accepted


def test_a_point_improvement_past_the_margin_is_refused_when_the_bound_is_not():
    mine, theirs = [0.95, 0.90, 0.99, 0.93] * 5, [0.93] * 20  # improvements +.02 -.03 +.06 .00, 5 times
    assert gate.decide(scored(0.94), champion(0.93), policy(), METRICS).accepted  # the margin alone passes
    decision = gate.decide(scored(0.94), champion(0.93), CONFIDENT, METRICS, paired(mine, theirs))
    assert not decision.accepted
    assert decision.interval is not None and decision.interval.lower_bound == pytest.approx(-0.03)
    assert decision.reasons[0] == (
        "macro_f1 improvement +0.0100 over champion v3, 95% interval lower bound -0.0300 <= min_improvement "
        "0.002 (20 paired resamples, seed 0)"
    )


def test_a_clear_improvement_is_accepted_stating_its_interval():
    mine, theirs = [0.95, 0.96, 0.97, 0.95] * 5, [0.90, 0.91, 0.90, 0.89] * 5
    decision = gate.decide(scored(0.96), champion(0.90), CONFIDENT, METRICS, paired(mine, theirs, seed=7))
    assert decision.accepted
    assert decision.reasons == (
        f"macro_f1 0.9600 beats champion v3's 0.9000 on {DATA}: improvement +0.0600, "
        "95% interval lower bound +0.0500 > min_improvement 0.002 (20 paired resamples, seed 7)",
    )
    assert decision.to_dict()["interval"] == {
        "metric": "macro_f1",
        "confidence": 0.95,
        "resamples": 20,
        "seed": 7,
        "improvement": pytest.approx(0.06),
        "lower_bound": pytest.approx(0.05),
        "non_finite": 0,
    }


def test_a_bound_past_the_margin_does_not_pass_a_point_improvement_short_of_it():
    above = paired([0.95] * 20, [0.93] * 20)
    decision = gate.decide(scored(0.931), champion(0.93), CONFIDENT, METRICS, above)
    assert not decision.accepted
    assert "improvement +0.0010 over champion v3 is below min_improvement 0.002" in decision.reasons[0]


def test_without_paired_scores_or_with_another_metric_s_a_confident_gate_refuses():
    for missing in (None, paired([0.2], [0.3], "mse")):
        decision = gate.decide(scored(0.99), champion(0.90), CONFIDENT, METRICS, missing)
        assert not decision.accepted and decision.interval is None
        assert "macro_f1: no paired bootstrap of it against champion v3" in decision.reasons[0]


def test_one_resample_certifies_nothing():
    # One resample's improvement (+0.05) lies far above the whole split's (+0.01): read as a "95% bound",
    # it would promote the candidate. It is one draw, at the median in expectation, not a 5% quantile.
    one = paired([0.95], [0.90])
    decision = gate.decide(scored(0.94), champion(0.93), CONFIDENT, METRICS, one)
    assert not decision.accepted and decision.interval is None
    assert decision.reasons == (
        "macro_f1: the margin 0.002 over champion v3 is not certified: --confidence 0.95 with "
        "--bootstrap-resamples 1: a 95% lower bound is the 5% quantile of the resamples, which needs at "
        "least 19 of them; raise --bootstrap-resamples to 19 or more, or lower --confidence",
    )
    # The same evidence 19 times over is enough resamples to read a bound from.
    nineteen = paired([0.95] * 19, [0.90] * 19)
    assert gate.decide(scored(0.94), champion(0.93), CONFIDENT, METRICS, nineteen).accepted


def test_a_test_split_of_fewer_than_30_rows_certifies_nothing():
    mine, theirs = [0.95, 0.96, 0.97, 0.95] * 250, [0.90, 0.91, 0.90, 0.89] * 250  # 1000 clear improvements
    three = gate.decide(scored(0.96), champion(0.90), CONFIDENT, METRICS, paired(mine, theirs, rows=3))
    assert not three.accepted and three.interval is None
    assert three.reasons == (
        "macro_f1: the margin 0.002 over champion v3 is not certified: the test split has 3 rows, fewer than "
        "the 30 a paired bootstrap needs; evaluate on a larger test split, or gate without --confidence",
    )
    assert MIN_TEST_ROWS == 30
    enough = gate.decide(scored(0.96), champion(0.90), CONFIDENT, METRICS, paired(mine, theirs, rows=30))
    assert enough.accepted and enough.interval is not None
    # Without a confidence, the margin alone decides on any test split, as it always did.
    assert gate.decide(scored(0.96), champion(0.90), policy(), METRICS).accepted


def test_a_first_model_is_held_to_the_first_model_floors_not_to_a_confidence():
    first = policy(first_model_floors={"macro_f1": 0.9}, confidence=0.95)
    decision = gate.decide(scored(0.92), Champion.none(), first, METRICS)
    assert decision.accepted and decision.interval is None
    assert decision.reasons == ("no champion yet; first-model floors met",)
    assert "interval" not in decision.to_dict()


def test_the_policy_describes_its_confidence_only_when_it_has_one():
    assert "confidence" not in GatePolicy().describe()
    assert GatePolicy(confidence=0.975).describe()["confidence"] == "0.975"


@pytest.mark.parametrize("value", [0.0, 1.0, 1.5, -0.1, math.nan, math.inf])
def test_a_confidence_outside_zero_to_one_is_refused_in_one_line(value):
    with pytest.raises(InputError, match=r"^--confidence .*: expected a number between 0 and 1, exclusive"):
        GatePolicy(confidence=value)


# -- resampling -----------------------------------------------------------------------------------------


def test_the_resamples_come_from_the_seed_alone_and_stay_in_range():
    first = [indices.tolist() for indices in resample_indices(50, 20, seed=3)]
    torch.manual_seed(123)  # the global generator does not move them
    again = [indices.tolist() for indices in resample_indices(50, 20, seed=3)]
    other = [indices.tolist() for indices in resample_indices(50, 20, seed=4)]
    assert first == again and first != other
    assert len(first) == 20 and all(len(rows) == 50 and 0 <= min(rows) <= max(rows) < 50 for rows in first)
    assert any(len(set(rows)) < 50 for rows in first)  # with replacement


class RowsSplit:
    """A map-style split that is no TensorSplit: an int gives one row, a tensor of indices a batch."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


def _rows(count: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(count, 3, generator=generator)
    return x, x @ torch.tensor([2.0, -1.0, 0.5]) + 1.0


def test_a_tensor_split_is_gathered_and_any_other_split_seen_through_the_indices():
    x, y = _rows(6)
    indices = torch.tensor([5, 0, 0, 3, 5, 1])
    gathered = resampled(TensorSplit(x, y, keys=[f"k{i}" for i in range(6)]), indices)
    assert isinstance(gathered, TensorSplit)
    assert torch.equal(gathered.inputs, x[indices]) and gathered.keys == ["k5", "k0", "k0", "k3", "k5", "k1"]

    wrapped = resampled(RowsSplit(x, y), indices)
    assert isinstance(wrapped, ResampledSplit) and len(wrapped) == 6
    assert torch.equal(wrapped[0][0], x[5]) and torch.equal(wrapped[-1][0], x[1])
    batch, targets = wrapped[torch.arange(6)]
    assert torch.equal(batch, x[indices]) and torch.equal(targets, y[indices])
    assert [row[1].item() for row in wrapped] == y[indices].tolist()  # iteration ends at the end
    assert torch.equal(wrapped[[1, 2]][0], x[[0, 0]]) and torch.equal(wrapped[2:4][0], x[[0, 3]])


def test_a_task_scores_both_kinds_of_split_alike_and_one_model_against_itself_is_refused():
    task = RegressionTask()
    torch.manual_seed(0)
    model = task.build_model({"features": 3})
    x, y = _rows()
    resampling = Resampling("mse", resamples=25, seed=2)
    tensors = resampled_scores(task, model, TensorSplit(x, y), resampling)
    rows = resampled_scores(task, model, RowsSplit(x, y), resampling)
    assert len(tensors) == 25 and len(set(tensors)) > 1  # each resample its own rows
    assert tensors == pytest.approx(rows)
    assert resampled_scores(task, model, TensorSplit(x, y), resampling) == tensors  # same seed, same values

    same = PairedScores("mse", 2, tensors, tensors, len(x))
    mse = task.score(model, TensorSplit(x, y))["mse"]
    on_mse = policy(primary_metric="mse", confidence=0.9)
    current = Champion.loaded("1", Scored({"mse": mse}, DATA, "c" * 64))
    decision = gate.decide(Scored({"mse": mse}, DATA, "a" * 64), current, on_mse, task.metrics, same)
    assert not decision.accepted and decision.interval.lower_bound == 0.0


def test_the_evaluation_s_record_reads_back_as_the_same_paired_scores():
    resampling = Resampling("macro_f1", resamples=2, seed=5)
    record = paired_document(resampling, paired([0.9, 0.8], [0.7, 0.6], seed=5))
    assert record == {
        "metric": "macro_f1", "resamples": 2, "seed": 5, "candidate": [0.9, 0.8], "champion": [0.7, 0.6]
    }  # fmt: skip
    assert paired_from_document(record, 188) == paired([0.9, 0.8], [0.7, 0.6], seed=5)
    assert paired_from_document(paired_document(resampling, None), 188) is None
    with pytest.raises(ValueError, match="3 paired values, but 2 resamples recorded"):
        paired_from_document({**record, "candidate": [1, 2, 3], "champion": [1, 2, 3]}, 188)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"resamples": 0}, r"^--bootstrap-resamples 0: expected a whole number >= 1"),
        ({"resamples": 2.5}, r"^--bootstrap-resamples 2.5: expected a whole number >= 1"),
        ({"seed": -1}, r"^--bootstrap-seed -1: expected a whole number >= 0"),
    ],
)
def test_a_resampling_needs_whole_counts(given, message):
    with pytest.raises(InputError, match=message):
        Resampling("macro_f1", **given)
