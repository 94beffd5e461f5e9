"""Errors of the pipeline layer: each message is one line naming the bad input and the expected form."""

from __future__ import annotations

from core.errors import RetrainError


class PipelineError(RetrainError):
    """Base class: the command line prints the message alone and exits 2. A message may carry lines of
    its own (a failed step's log tail), so it is kept as written."""

    one_line = False


class SpecError(PipelineError):
    """A component, environment, compute or pipeline YAML does not say what the code needs."""


class SubmissionError(PipelineError):
    """A run request cannot be submitted as asked (bad request, quota, duplicate)."""


class RunRefused(SubmissionError):
    """A submitter refused the run before starting anything, for what it was asked to run (its task refuses
    its gate policy or a parameter, or a metric names a class its data lacks): nothing ran, and the same
    request is refused again, so a caller holds it rather than counting it as a run."""


class JobNotFound(SubmissionError):
    """The submitter has no job of that name (never created, or gone): a job in flight that is not found
    will never end, and whoever waits for it must stop waiting."""


class StepFailed(PipelineError):
    """A pipeline step exited non-zero; the message carries the tail of its log."""


class ConfigError(PipelineError):
    """A model's configuration file (models/<name>.toml) does not say what it must: the message names the
    file, the key and the expected form."""


class AzureAccessError(PipelineError):
    """The workspace could not be reached, or refused this identity: one line naming the workspace, what
    failed and how to fix it."""

    one_line = True


class SubmitterUnavailable(PipelineError):
    """RETRAIN_SUBMITTER names no submitter, or one this installation does not ship
    (components/submitters.py): one line naming the setting and what to set instead."""

    one_line = True
