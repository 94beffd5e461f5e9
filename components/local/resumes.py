"""What a training's metadata.json says of its resumes, in words: `resumed at step 3000 after an eviction`;
and its warnings (checkpoint saves that did not happen), which the run says too, not only the step's log.

The trainer keeps every attempt of one training in its checkpoints, and once done writes them into the
model's metadata.json (training/engine/trainer.py): the step an attempt started at, the checkpoint it
resumed from, and how it ended: `preempted` when it honoured an eviction notice (SIGTERM, or a Ctrl-C
forwarded by the runner) and saved; `completed`; `diverged`; nothing when its process was killed or its
node lost, since nobody was left to write it (the checkpoint it resumes from was an interval save). So a
resume is told by the attempt before it, including resumes of an earlier `retrain run` of the same
training. components/ never imports training/: this reads the file, not the trainer's classes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

METADATA_FILE = "metadata.json"  # training/engine/outputs.py
TRAINING_FORMAT = "retrain-training/1"
_CAUSES = {
    "preempted": "after an eviction",
    "completed": "of a training already finished",
    "diverged": "after a divergence",
}
_LOST = "after its process ended unannounced (killed, or its node lost)"


def _training_metadata(folder: Path) -> Mapping[str, Any]:
    """The metadata of the training whose outputs are in `folder`; empty when it holds no training's
    (another step's output) or it cannot be read: telling never fails a step."""
    try:
        metadata = json.loads((folder / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(metadata, Mapping) or metadata.get("format") != TRAINING_FORMAT:
        return {}
    return metadata


def warning_lines(folder: Path) -> list[str]:
    """The warnings the training whose outputs are in `folder` wrote into its metadata, each one line."""
    warnings = _training_metadata(folder).get("warnings")
    if not isinstance(warnings, list):
        return []
    return [f"warning: {' '.join(str(each).split())}" for each in warnings]


def resume_lines(folder: Path) -> list[str]:
    """One line per resume of the training whose outputs are in `folder`."""
    attempts = _training_metadata(folder).get("attempts")
    if not isinstance(attempts, list):
        return []
    return [
        _line(attempt, attempts[index - 1] if index else None)
        for index, attempt in enumerate(attempts)
        if isinstance(attempt, Mapping) and attempt.get("resumed_from")
    ]


def _line(attempt: Mapping[str, Any], before: Any) -> str:
    ended = before.get("ended") if isinstance(before, Mapping) else None
    cause = _CAUSES.get(str(ended), _LOST) if ended is not None else _LOST
    return f"resumed at step {attempt.get('started_at_step')} {cause} (checkpoint {attempt['resumed_from']})"
