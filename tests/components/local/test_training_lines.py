"""What the local runner says of a finished train step, read from its metadata.json (components/local/
resumes.py): its warnings, so that a checkpoint save that did not happen is in the run's own lines, not
only in the step's log (issue 41)."""

from __future__ import annotations

import json
from pathlib import Path

from components.local.resumes import TRAINING_FORMAT, warning_lines


def test_a_trainings_warnings_are_said_one_line_each(tmp_path: Path) -> None:
    warnings = [
        "1 earlier checkpoint save(s) at step(s) 50 failed (no space left on device on /ckpt); the saves "
        "after them in /ckpt are durable",
        "the last 1 checkpoint save(s) failed (reason\nspanning lines); the model in /out is complete",
    ]
    metadata = {"format": TRAINING_FORMAT, "attempts": [], "warnings": warnings}
    (tmp_path / "metadata.json").write_text(json.dumps(metadata))
    assert warning_lines(tmp_path) == [
        f"warning: {warnings[0]}",
        "warning: the last 1 checkpoint save(s) failed (reason spanning lines); the model in /out is "
        "complete",
    ]


def test_no_warning_is_said_for_another_steps_output_or_an_unreadable_file(tmp_path: Path) -> None:
    assert warning_lines(tmp_path) == []  # no metadata.json
    (tmp_path / "metadata.json").write_text(json.dumps({"format": "other/1", "warnings": ["not ours"]}))
    assert warning_lines(tmp_path) == []
    (tmp_path / "metadata.json").write_bytes(b"\xff\xfe not json")
    assert warning_lines(tmp_path) == []
