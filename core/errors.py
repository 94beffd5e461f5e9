"""Errors a user can act on, under one root.

Every `RetrainError` names the bad input (or state) and the form it should take; a command line prints
the message as is and exits with its `exit_code` (2 unless a subclass says otherwise), without a
traceback. Each room keeps the subclasses it raises where it raises them (components/errors.py's
`PipelineError`, function_app/ledger/records.py's `LedgerError`, function_app/settings/storage.py's
`SettingsError`, ...); they all derive from `RetrainError`, so a caller that catches the root catches
every one of them.
"""

from __future__ import annotations

from typing import ClassVar


class RetrainError(Exception):
    """A failure caused by input or state the user can fix."""

    exit_code = 2  # bad input; training/engine/divergence.py's TrainingDiverged has its own
    # The message's whitespace (line breaks included) is collapsed to single spaces. A family whose
    # message carries lines of its own (a failed step's log tail) says False.
    one_line: ClassVar[bool] = True

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()) if self.one_line else message)


class InputError(RetrainError):
    """Bad input data or arguments: a missing folder, a wrong column, a value of the wrong form."""


class CheckpointError(RetrainError):
    """A checkpoint that cannot be written, read or trusted."""


class ResumeRefusedError(RetrainError):
    """A checkpoint exists but resuming from it would silently change the run (other data, other config)."""


def require(ok: bool, message: str) -> None:
    """Refuse a bad input in one line: InputError(message) unless `ok`."""
    if not ok:
        raise InputError(message)
