"""The registration gate as a pure function: every way a candidate passes or is refused, and why."""

from __future__ import annotations

import math

import pytest

from core.errors import InputError
from training.gate import policy as gate
from training.gate.policy import (
    Champion,
    GatePolicy,
    Scored,
    parse_bounds,
    policy_for_task,
    task_defaults,
    validate_policy_metrics,
)
from training.tasks.base import Metric, MetricSet

DATA = "dv-0123456789abcdef"
GOOD = {"accuracy": 0.95, "macro_f1": 0.94, "loss": 0.2, "recall_0": 0.96, "recall_1": 0.92}


def scored(data_version: str = DATA, weights: str = "a" * 64, **changes: float) -> Scored:
    return Scored({**GOOD, **changes}, data_version, weights)


def champion(version: str = "3", **changes: float) -> Champion:
    return Champion.loaded(version, scored(weights="c" * 64, **changes))


def without(metric: str) -> Scored:
    return Scored({name: value for name, value in GOOD.items() if name != metric}, DATA, "a" * 64)


POLICY = GatePolicy()
CLASSIFIER = MetricSet(
    (
        Metric("accuracy", "higher"),
        Metric("macro_f1", "higher"),
        Metric("loss", "lower"),
        Metric("recall_*", "higher"),
    )
)
REGRESSION = MetricSet((Metric("mse", "lower"), Metric("r2", "higher")))


def decide(candidate: Scored, current: Champion, policy: GatePolicy, metrics: MetricSet = CLASSIFIER):
    return gate.decide(candidate, current, policy, metrics)


def test_a_candidate_that_beats_the_champion_by_the_margin_is_accepted_with_the_reason():
    decision = decide(scored(macro_f1=0.95), champion(macro_f1=0.94), POLICY)
    assert decision.accepted
    assert decision.reasons == (f"macro_f1 0.9500 beats champion v3's 0.9400 by at least 0.002 on {DATA}",)
    assert (decision.candidate_value, decision.champion_value, decision.champion_version) == (0.95, 0.94, "3")


def test_a_worse_candidate_is_rejected():
    decision = decide(scored(macro_f1=0.90), champion(macro_f1=0.94), POLICY)
    assert not decision.accepted
    assert "does not beat champion v3's 0.9400" in decision.summary
    assert "(improvement -0.0400)" in decision.summary


def test_an_improvement_inside_the_margin_is_rejected():
    decision = decide(scored(macro_f1=0.941), champion(macro_f1=0.94), POLICY)
    assert not decision.accepted
    assert "by the margin 0.002 (improvement +0.0010)" in decision.reasons[0]


def test_a_tie_is_rejected_even_with_no_margin():
    decision = decide(scored(), champion(), GatePolicy(min_improvement=0.0))
    assert not decision.accepted
    assert "improvement +0.0000" in decision.reasons[0]


def test_loss_as_primary_metric_must_go_down():
    policy = GatePolicy(primary_metric="loss", min_improvement=0.01)
    assert decide(scored(loss=0.15), champion(loss=0.2), policy).accepted
    rejected = decide(scored(loss=0.25), champion(loss=0.2), policy)
    assert not rejected.accepted
    assert "loss 0.2500 does not beat champion v3's 0.2000" in rejected.reasons[0]


def test_every_candidate_must_meet_the_floors_even_when_it_beats_the_champion():
    decision = decide(scored(accuracy=0.75, macro_f1=0.80), champion(accuracy=0.74, macro_f1=0.70), POLICY)
    assert not decision.accepted
    assert decision.reasons == ("accuracy 0.7500 is below the floor 0.8",)


def test_a_loss_floor_is_a_maximum():
    policy = GatePolicy(floors={"loss": 0.3})
    decision = decide(scored(loss=0.35, macro_f1=0.99), champion(), policy)
    assert not decision.accepted
    assert "loss 0.3500 is above the floor 0.3" in decision.reasons


def test_a_secondary_metric_may_not_regress_beyond_its_allowance():
    decision = decide(scored(macro_f1=0.96, accuracy=0.93), champion(accuracy=0.95), POLICY)
    assert not decision.accepted
    assert decision.reasons == ("accuracy regresses by 0.0200 against the champion; at most 0.01 allowed",)


def test_a_per_class_recall_may_not_regress_beyond_the_recall_allowance():
    decision = decide(scored(macro_f1=0.96, recall_1=0.80), champion(recall_1=0.92), POLICY)
    assert not decision.accepted
    assert decision.reasons == ("recall_1 regresses by 0.1200 against the champion; at most 0.1 allowed",)
    assert decide(scored(macro_f1=0.96, recall_1=0.85), champion(recall_1=0.92), POLICY).accepted


def test_a_class_the_candidate_has_no_recall_for_is_a_regression():
    candidate = Scored({name: value for name, value in GOOD.items() if name != "recall_1"}, DATA, "a" * 64)
    decision = decide(candidate, champion(macro_f1=0.90), POLICY)
    assert not decision.accepted
    assert "candidate has no usable recall_1 to compare with the champion's" in decision.reasons


def test_the_first_model_must_meet_the_first_model_floors():
    decision = decide(scored(accuracy=0.85, macro_f1=0.84), Champion.none(), POLICY)
    assert not decision.accepted
    assert decision.reasons == (
        "accuracy 0.8500 is below the first-model floor 0.9",
        "macro_f1 0.8400 is below the first-model floor 0.9",
    )
    accepted = decide(scored(), Champion.none(), POLICY)
    assert accepted.accepted
    assert accepted.reasons == ("no champion yet; first-model floors met",)
    assert accepted.champion_version is None and accepted.champion_value is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_candidate_metric_is_rejected(bad: float):
    decision = decide(scored(macro_f1=bad), champion(), POLICY)
    assert not decision.accepted
    assert decision.reasons == ("candidate's macro_f1 is not a finite number",)


def test_a_missing_candidate_metric_is_rejected_whatever_the_champion():
    for current in (champion(), Champion.none()):
        decision = decide(without("macro_f1"), current, POLICY)
        assert not decision.accepted
        assert decision.reasons == ("candidate has no macro_f1",)


def test_a_metric_the_floors_name_must_be_present():
    decision = decide(without("accuracy"), Champion.none(), POLICY)
    assert decision.reasons == ("candidate has no accuracy",)


def test_a_champion_with_a_non_finite_primary_metric_is_not_beaten_by_default():
    decision = decide(scored(), champion(macro_f1=math.nan), POLICY)
    assert not decision.accepted
    assert decision.reasons == ("champion v3's macro_f1 is not a finite number",)


def test_scores_on_different_data_versions_are_never_compared():
    theirs = Champion.loaded("3", scored(data_version="dv-ffffffffffffffff", macro_f1=0.5))
    decision = decide(scored(macro_f1=0.99), theirs, POLICY)
    assert not decision.accepted
    assert decision.reasons == (
        f"champion v3 was scored on dv-ffffffffffffffff, the candidate on {DATA}; "
        "scores on different data are not comparable",
    )


def test_an_unloadable_champion_blocks_registration_without_a_bootstrap():
    decision = decide(scored(), Champion.unloadable("3", "model.pt2 is missing"), POLICY)
    assert not decision.accepted
    assert decision.reasons == (
        "champion v3 cannot be loaded (model.pt2 is missing); fix it, or allow a bootstrap",
    )
    assert decision.champion_version == "3"


def test_a_bootstrap_replaces_an_unloadable_champion_if_the_first_model_floors_are_met():
    policy = GatePolicy(bootstrap_unloadable_champion=True)
    unloadable = Champion.unloadable("3", "model.pt2 is missing")
    accepted = decide(scored(), unloadable, policy)
    assert accepted.accepted
    assert accepted.reasons == ("bootstrap over unloadable champion v3; first-model floors met",)
    refused = decide(scored(accuracy=0.85, macro_f1=0.85), unloadable, policy)
    assert not refused.accepted
    assert "accuracy 0.8500 is below the first-model floor 0.9" in refused.reasons


def test_the_decision_serialises_with_its_reasons_as_a_list():
    document = decide(scored(macro_f1=0.95), champion(macro_f1=0.94), POLICY).to_dict()
    assert document["accepted"] is True
    assert document["reasons"] == [f"macro_f1 0.9500 beats champion v3's 0.9400 by at least 0.002 on {DATA}"]
    assert document["primary_metric"] == "macro_f1"


def test_policy_options_parse_into_the_policy_and_describe_back_to_the_same_text():
    policy = GatePolicy.from_options(
        "accuracy", 0.01, "accuracy=0.85,loss=0.4", "macro_f1=0.02,recall_*=0.05", "none", True
    )
    assert policy.floors == {"accuracy": 0.85, "loss": 0.4}
    assert policy.max_regression == {"macro_f1": 0.02, "recall_*": 0.05}
    assert policy.first_model_floors == {}
    assert policy.describe() == {
        "primary_metric": "accuracy",
        "min_improvement": "0.01",
        "floors": "accuracy=0.85,loss=0.4",
        "max_regression": "macro_f1=0.02,recall_*=0.05",
        "first_model_floors": "none",
        "bootstrap_unloadable_champion": "true",
    }
    defaults = GatePolicy().describe()
    again = GatePolicy.from_options(
        defaults["primary_metric"],
        float(defaults["min_improvement"]),
        defaults["floors"],
        defaults["max_regression"],
        defaults["first_model_floors"],
    )
    assert again == GatePolicy()


@pytest.mark.parametrize(
    ("text", "option"),
    [
        ("accuracy", "--floors"),
        ("accuracy=high", "--floors"),
        ("=0.9", "--max-regression"),
        ("a=nan", "--floors"),
    ],
)
def test_malformed_bounds_are_refused_in_one_line_naming_the_option(text: str, option: str):
    with pytest.raises(InputError, match=f"^{option} .*expected METRIC=NUMBER") as raised:
        parse_bounds(text, option)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"primary_metric": ""}, "--primary-metric '': expected the name of one of the task's metrics"),
        ({"primary_metric": "recall_*"}, "--primary-metric 'recall_*': a family of metrics; name one"),
        ({"min_improvement": -0.1}, "--min-improvement -0.1: expected a number >= 0"),
        ({"min_improvement": math.nan}, "--min-improvement nan: expected a number >= 0"),
        ({"max_regression": {"accuracy": -0.01}}, "--max-regression ['accuracy']: expected allowances >= 0"),
    ],
)
def test_an_impossible_policy_is_refused_at_construction(changes: dict, message: str):
    with pytest.raises(InputError) as raised:
        GatePolicy(**changes)
    assert str(raised.value).startswith(message)


def test_the_policy_cannot_be_changed_after_construction():
    policy = GatePolicy()
    with pytest.raises(TypeError):
        policy.floors["accuracy"] = 0.0  # type: ignore[index]


# -- directions and defaults from the task ---------------------------------------------------------------


def regression(version: str | None = None, **metrics: float) -> Scored | Champion:
    scores = Scored(metrics, DATA, "r" * 64)
    return scores if version is None else Champion.loaded(version, scores)


def test_a_lower_is_better_metric_from_the_task_must_go_down_to_win():
    policy = policy_for_task(REGRESSION, "mse")
    assert decide(
        regression(mse=0.10, r2=0.5), regression("1", mse=0.20, r2=0.4), policy, REGRESSION
    ).accepted
    refused = decide(regression(mse=0.30, r2=0.6), regression("1", mse=0.20, r2=0.4), policy, REGRESSION)
    assert not refused.accepted
    assert refused.reasons == (
        "mse 0.3000 does not beat champion v1's 0.2000 by the margin 0.002 (improvement -0.1000)",
    )


def test_a_floor_on_a_lower_is_better_metric_is_a_maximum():
    policy = policy_for_task(REGRESSION, "mse", first_model_floors="mse=0.5,r2=0.3")
    refused = decide(regression(mse=0.7, r2=0.2), Champion.none(), policy, REGRESSION)
    assert refused.reasons == (
        "mse 0.7000 is above the first-model floor 0.5",
        "r2 0.2000 is below the first-model floor 0.3",
    )
    assert decide(regression(mse=0.4, r2=0.35), Champion.none(), policy, REGRESSION).accepted


def test_a_task_gets_its_primary_metric_and_only_the_classifier_bounds_on_metrics_it_reports():
    assert task_defaults(REGRESSION, "mse") == GatePolicy(
        primary_metric="mse", floors={}, max_regression={}, first_model_floors={}
    )
    assert task_defaults(CLASSIFIER, "macro_f1") == GatePolicy()
    accuracy_only = MetricSet((Metric("accuracy", "higher"), Metric("loss", "lower")))
    assert task_defaults(accuracy_only, "accuracy") == GatePolicy(
        primary_metric="accuracy",
        max_regression={"accuracy": 0.01},
        first_model_floors={"accuracy": 0.9},
    )


def test_given_values_override_the_task_defaults_and_default_keeps_them():
    policy = policy_for_task(
        CLASSIFIER, "macro_f1", primary_metric="default", floors="default", max_regression="none"
    )
    assert policy == GatePolicy(max_regression={})
    configured = policy_for_task(
        REGRESSION, "mse", primary_metric="r2", min_improvement=0.0, floors={"mse": 1}
    )
    assert (configured.primary_metric, configured.min_improvement, dict(configured.floors)) == (
        "r2",
        0.0,
        {"mse": 1},
    )


def test_a_policy_naming_a_metric_the_task_does_not_report_is_refused_naming_it():
    with pytest.raises(InputError) as raised:
        policy_for_task(REGRESSION, "mse", floors="accuracy=0.9", where="models/house.toml [gate]")
    assert str(raised.value).startswith(
        "models/house.toml [gate]: floors names metric 'accuracy', which the task does not report; "
        "expected one of mse (lower is better), r2 (higher is better)"
    )
    with pytest.raises(InputError, match="primary_metric names metric 'macro_f1'"):
        validate_policy_metrics(GatePolicy(), REGRESSION)


def test_a_family_floor_bounds_every_member_and_a_named_member_wins():
    policy = GatePolicy(floors={"recall_*": 0.9, "recall_1": 0.5}, first_model_floors={})
    refused = decide(scored(recall_0=0.85, recall_1=0.6), Champion.none(), policy)
    assert refused.reasons == ("recall_0 0.8500 is below the floor 0.9",)
    nan = decide(scored(recall_0=math.nan), Champion.none(), policy)
    assert nan.reasons == ("recall_0 is not a finite number, so it cannot meet the floor 0.9",)
