"""The errors a task file raises, where task authors import them: `retrain init`'s task template (and every
task file written from it) has `from training.errors import InputError`. The one error root and its
subclasses are core/errors.py's; this module names them for the task-facing package."""

from __future__ import annotations

from core.errors import CheckpointError, InputError, ResumeRefusedError, RetrainError

__all__ = ["CheckpointError", "InputError", "ResumeRefusedError", "RetrainError"]
