"""The local pipeline runner, the embedded default: the pipeline's steps as processes on this machine.

It executes the very `command:` lines of the component YAMLs, in dependency order, maps outputs to
folders under the state folder, reuses unchanged steps from an immutable cache, runs `distribution:
pytorch` steps under torchrun, and restarts a preempted training step so that it resumes.
"""

from components.local.options import RunnerOptions
from components.local.runner import LocalRunner, LocalStepFailed
from components.local.runs import RunRecord, RunStore, StepAttempt, StepRecord

__all__ = [
    "LocalRunner",
    "LocalStepFailed",
    "RunRecord",
    "RunStore",
    "RunnerOptions",
    "StepAttempt",
    "StepRecord",
]
