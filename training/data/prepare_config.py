"""`retrain prepare`'s config: the pipeline's first step (components/prep.yml), a frozen dataclass whose
fields are the command's flags too (core/flags.py).

The gate policy rides along so that a policy naming a metric the task does not report is refused before any
data is prepared (training/cli.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.flags import flag
from training.engine.config import DEFAULT_TASK
from training.gate.options import GatePolicyOptions
from training.tasks.task_flags import task_flag, task_options_flag

DEFAULT_SPLIT = "0.8,0.1,0.1"


@dataclass(frozen=True, kw_only=True)  # keyword-only: the fields (and flags) in the order of --help
class PrepareConfig:
    task: str = field(default=DEFAULT_TASK, metadata=task_flag())
    task_options: dict[str, Any] = field(default_factory=dict, metadata=task_options_flag())
    raw: Path = field(metadata=flag(parse=Path, help="folder of raw files (the task's kind)"))
    # A blob data version is its manifest in the model's object store (core/pinned_store.py): --raw is then
    # the store, and this says which version in it to read. A folder of the files themselves ignores it.
    raw_version: str | None = field(
        default=None,
        metadata=flag(
            metavar="VERSION",
            help="when --raw is a blob data store: the raw data version to read (rd-..., or 'latest': the "
            "one pinned last); a folder of raw files ignores it",
        ),
    )
    out: Path = field(metadata=flag(parse=Path, help="new folder for the prepared data version"))
    previous: Path | None = field(
        default=None,
        metadata=flag(parse=Path, help="an earlier prepared version to build on incrementally"),
    )
    rejected: Path | None = field(
        default=None,
        metadata=flag(
            parse=Path,
            help="folder for rejected.json: the raw files left out because they do not fit, and why",
        ),
    )
    split: str = field(
        default=DEFAULT_SPLIT,
        metadata=flag(
            metavar="TRAIN,VALIDATION,TEST",
            help="fractions of rows per split, adding up to 1 (default 0.8,0.1,0.1)",
        ),
    )
    # Checked against the task's metrics before anything is prepared.
    policy: GatePolicyOptions = field(default_factory=GatePolicyOptions, metadata=flag(group="gate policy"))
