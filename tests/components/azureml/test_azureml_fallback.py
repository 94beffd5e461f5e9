"""The dedicated fallback's decisions (pure): what counts as a preemption, and where the next attempt runs."""

from __future__ import annotations

import pytest

from components.azureml.fallback import (
    PREEMPTION_TAG,
    Attempt,
    FallbackPolicy,
    decide_next_attempt,
    train_child,
    was_preempted,
)
from components.azureml.workspace import JobRecord
from components.errors import SubmissionError

POLICY = FallbackPolicy(max_preemptions=2, dedicated_compute="gpu-dedicated", max_attempts=4)


def attempt(
    number: int, job_status: str = "Failed", train_status: str = "Failed", tagged: bool = True
) -> Attempt:
    tags = {PREEMPTION_TAG: "30"} if tagged else {}
    train = JobRecord(f"child-{number}", train_status, display_name="train", tags=tags)
    return Attempt(number, JobRecord(f"job-r{number}", job_status), train)


def test_the_train_child_is_found_by_its_step_name():
    children = [
        JobRecord("a", "Completed", display_name="prep"),
        JobRecord("b", "Failed", display_name="train"),
    ]
    assert train_child(children) == children[1]
    assert train_child(children[:1]) is None


@pytest.mark.parametrize(
    ("candidate", "preempted"),
    [
        (attempt(0), True),
        (attempt(0, job_status="Canceled", train_status="Canceled"), True),
        (attempt(0, tagged=False), False),  # failed for another reason
        (attempt(0, job_status="Running", train_status="Running"), False),  # resumed by Azure ML itself
        (Attempt(0, JobRecord("job", "Failed"), None), False),  # no train child: it never started
    ],
)
def test_what_counts_as_a_preemption(candidate, preempted):
    assert was_preempted(candidate) is preempted


def test_below_the_threshold_the_next_attempt_stays_on_the_same_compute():
    decision = decide_next_attempt([attempt(0)], POLICY)
    assert (decision.resubmit, decision.attempt, decision.train_compute) == (True, 1, None)


def test_at_the_threshold_the_next_attempt_runs_on_dedicated():
    decision = decide_next_attempt([attempt(0), attempt(1)], POLICY)
    assert (decision.resubmit, decision.attempt, decision.train_compute) == (True, 2, "gpu-dedicated")
    assert decision.reason == "preempted 2 times; resuming on dedicated compute gpu-dedicated"


def test_earlier_real_failures_do_not_count_as_preemptions():
    decision = decide_next_attempt([attempt(0, tagged=False), attempt(1)], POLICY)
    assert (decision.resubmit, decision.train_compute) == (True, None)


def test_a_real_failure_ends_the_run():
    decision = decide_next_attempt([attempt(0), attempt(1, tagged=False)], POLICY)
    assert (decision.resubmit, decision.attempt) == (False, 1)
    assert decision.reason == "job-r1 failed, not preempted"


def test_the_attempt_limit_ends_the_run():
    decision = decide_next_attempt([attempt(number) for number in range(4)], POLICY)
    assert decision.resubmit is False
    assert decision.reason == "job-r3 preempted; 4 attempts made, at most 4 allowed"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_preemptions": 0}, r"max preemptions 0: expected at least 1"),
        (
            {"max_preemptions": 3, "max_attempts": 3},
            r"max attempts 3: expected more than max preemptions \(3\)",
        ),
    ],
)
def test_a_policy_that_could_never_fall_back_is_refused(settings, message):
    with pytest.raises(SubmissionError, match=message):
        FallbackPolicy(**settings)
