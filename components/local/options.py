"""The local runner's options: where it keeps its state, which specs it runs, how it treats preemptions.

Its own module because both the runner and one run's execution (execution.py) read them, and the execution
must not import the runner that starts it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from components.errors import PipelineError
from components.specs import ENVIRONMENT_FILE, PIPELINE_FILE


@dataclass(frozen=True)
class RunnerOptions:
    """Where the runner keeps its state, which specs it runs, and how it treats preemptions."""

    state_root: Path
    pipeline_file: Path = PIPELINE_FILE
    environment_file: Path = ENVIRONMENT_FILE
    code_root: Path | None = None  # instead of every component's `code` folder: try code without editing it
    max_preemption_restarts: int = 3
    log_tail_lines: int = 20
    python: str = sys.executable
    # Fork `python -m` steps from one interpreter per run that has imported torch and MLflow already
    # (components/local/warm.py); off, each step starts a fresh interpreter. `retrain run` sets it from
    # RETRAIN_WARM_START (core/warm_start.py), which its steps, inheriting its environment, read too.
    warm_start: bool = True

    def __post_init__(self) -> None:
        if self.max_preemption_restarts < 0:
            raise PipelineError(f"max preemption restarts {self.max_preemption_restarts}: expected 0 or more")
        if self.log_tail_lines < 1:
            raise PipelineError(f"log tail lines {self.log_tail_lines}: expected 1 or more")
        object.__setattr__(self, "state_root", Path(self.state_root).resolve())
        if self.code_root is not None:
            object.__setattr__(self, "code_root", Path(self.code_root).resolve())
