"""The errors a task file raises, where task authors import them: `retrain init`'s task template (and every
task file written from it) has `from training.errors import InputError`. The one error root and its
subclasses are core/errors.py's; this module names them for the task-facing package. A task's prepare
raises `RawFilesRejected` (core/rejected_inputs.py), each `RejectedFile` with its reason, for raw files that
do not fit: the prepare step leaves them out and prepares the rest."""

from __future__ import annotations

from core.errors import CheckpointError, InputError, ResumeRefusedError, RetrainError
from core.rejected_inputs import RawFilesRejected, RejectedFile

__all__ = [
    "CheckpointError",
    "InputError",
    "RawFilesRejected",
    "RejectedFile",
    "ResumeRefusedError",
    "RetrainError",
]
