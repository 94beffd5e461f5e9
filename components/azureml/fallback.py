"""When spot capacity keeps getting evicted, finish the run on dedicated nodes. Pure decisions, no I/O.

How a preemption shows up: on eviction notice the trainer saves a checkpoint, tags its run
`retrain.preempted_at_step` and exits 75; the train step's child job fails, and with it the pipeline job
(continue_on_step_failure is off). So one preemption ends one attempt, and the evidence is on the train
step's child job as Azure ML reports it: terminal, and carrying the trainer's preemption tag. An attempt
that failed any other way is a real failure and is never resubmitted automatically.

The next attempt is the same logical run (same run key, same checkpoint path, so it resumes) under the
next job name (`-rN`). After `max_preemptions` preempted attempts it runs on the dedicated cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from components.azureml.workspace import JobRecord
from components.errors import SubmissionError
from components.specs import TRAIN_STEP

PREEMPTION_TAG = "retrain.preempted_at_step"
# Azure ML job states in which an attempt is over without success.
ENDED_UNSUCCESSFULLY = frozenset({"Failed", "Canceled"})


@dataclass(frozen=True)
class FallbackPolicy:
    max_preemptions: int = 2
    dedicated_compute: str = "gpu-dedicated"
    max_attempts: int = 6

    def __post_init__(self) -> None:
        if self.max_preemptions < 1:
            raise SubmissionError(
                f"max preemptions {self.max_preemptions}: expected at least 1 preempted attempt on spot "
                "before falling back to dedicated"
            )
        if self.max_attempts <= self.max_preemptions:
            raise SubmissionError(
                f"max attempts {self.max_attempts}: expected more than max preemptions "
                f"({self.max_preemptions}), or the dedicated fallback never runs"
            )


@dataclass(frozen=True)
class Attempt:
    """One submitted pipeline job of a logical run, and its train step's child job when known."""

    number: int
    job: JobRecord
    train: JobRecord | None = None

    @property
    def ended_unsuccessfully(self) -> bool:
        return self.job.status in ENDED_UNSUCCESSFULLY


@dataclass(frozen=True)
class Decision:
    resubmit: bool
    attempt: int
    train_compute: str | None
    reason: str


def train_child(children: Sequence[JobRecord]) -> JobRecord | None:
    """The train step's child job: the builder names each step's node after the step."""
    for child in children:
        if child.display_name == TRAIN_STEP:
            return child
    return None


def was_preempted(attempt: Attempt) -> bool:
    train = attempt.train
    return (
        attempt.ended_unsuccessfully
        and train is not None
        and train.status in ENDED_UNSUCCESSFULLY
        and PREEMPTION_TAG in train.tags
    )


def decide_next_attempt(attempts: Sequence[Attempt], policy: FallbackPolicy) -> Decision:
    """After the latest attempt ended unsuccessfully: resubmit (and where), or leave the run as it is."""
    if not attempts:
        raise ValueError("decide_next_attempt needs the attempts made so far")
    latest = attempts[-1]
    following = latest.number + 1
    if not was_preempted(latest):
        return Decision(
            False, latest.number, None, f"{latest.job.name} {latest.job.status.lower()}, not preempted"
        )
    preemptions = sum(1 for attempt in attempts if was_preempted(attempt))
    if following >= policy.max_attempts:
        return Decision(
            False,
            latest.number,
            None,
            f"{latest.job.name} preempted; {following} attempts made, at most {policy.max_attempts} allowed",
        )
    if preemptions >= policy.max_preemptions:
        return Decision(
            True,
            following,
            policy.dedicated_compute,
            f"preempted {preemptions} times; resuming on dedicated compute {policy.dedicated_compute}",
        )
    return Decision(True, following, None, f"preempted {preemptions} times; resuming on the same compute")
