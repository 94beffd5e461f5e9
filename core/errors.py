"""Errors a user can act on.

Every `RetrainError` message is a single line that names the bad input and the form it should take; the
CLI prints it as is and exits with its `exit_code` (2 unless a subclass says otherwise), without a traceback.
"""

from __future__ import annotations


class RetrainError(Exception):
    """A failure caused by input or state the user can fix."""

    exit_code = 2  # bad input; training/engine/divergence.py's TrainingDiverged has its own

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class InputError(RetrainError):
    """Bad input data or arguments: a missing folder, a wrong column, a value of the wrong form."""


class CheckpointError(RetrainError):
    """A checkpoint that cannot be written, read or trusted."""


class ResumeRefusedError(RetrainError):
    """A checkpoint exists but resuming from it would silently change the run (other data, other config)."""
