"""`retrain` as a separate process, as an operator or a pipeline step runs it, on sample images in class
folders: shared by the image task's end-to-end tests (test_image_resume.py, test_image_drift_cli.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.training.warm_training import WarmStarts
from training.tasks.image.sample_data import write_sample_images

# Set in the developer's shell, these would send a test's runs, or its drift events, somewhere else.
_OUTSIDE_SETTINGS = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "RETRAIN_DRIFT_TOPIC_ENDPOINT")


def isolated_environ(home: Path) -> dict[str, str]:
    """This environment, with the state folder in `home` and nothing pointing at an outside store."""
    environ = {key: value for key, value in os.environ.items() if key not in _OUTSIDE_SETTINGS}
    return {**environ, "RETRAIN_HOME": str(home)}


def run_retrain(starts: WarmStarts, *argv: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`retrain ARGV...` in its own process (forked warm); its exit code, stdout and stderr."""
    return starts.run([sys.executable, "-m", "training.cli", *argv], environ)


def prepared_image_folder(
    starts: WarmStarts,
    root: Path,
    *,
    per_class: int,
    seed: int,
    side: int,
    size: int,
    environ: dict[str, str],
) -> tuple[Path, Path]:
    """Sample PNGs in `root/raw/<class>/`, and `retrain prepare --task image` of them into `root/prepared`."""
    raw, prepared = root / "raw", root / "prepared"
    write_sample_images(raw, per_class=per_class, seed=seed, side=side)
    result = run_retrain(
        starts, "prepare", "--task", "image", "--task-option", f"size={size}", "--raw", str(raw), "--out",
        str(prepared), environ=environ,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return raw, prepared
