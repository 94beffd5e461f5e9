"""The trainer's configuration: one frozen dataclass, validated at construction.

Every validation error names the option and says what to use instead, because these objects are built
straight from command-line arguments and app settings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.train_rules import AUTO_INTERVAL as AUTO_INTERVAL  # where the trainer's callers look for it
from core.train_rules import TRAIN_RULES
from core.trajectory import TRAJECTORY_FIELDS  # the options a checkpoint resumes only under

PROGRESS_MODES = ("auto", "bar", "log", "jsonl", "none")

DEFAULT_CHECKPOINT_EVERY_SECONDS = 300.0

# The mean time between evictions of the training job: any node's eviction stops it, so on N nodes it is a
# node's MTBE / N. Azure publishes none for low-priority capacity, only coarse eviction-rate bands per VM
# size and region in the portal, which change with the hour; 12 hours is the cautious guess the cost
# estimate uses too (components/cost.py), so that the interval and the estimate assume the same capacity.
# Erring is cheap: the overhead is flat around Daly's optimum, so an MTBE off by a factor of 4 moves the
# interval by a factor of 2 and raises the overhead (saves plus rework) by only a quarter. Once measured
# (evictions per node-hour in the ledger), pass --mtbe-hours.
DEFAULT_MTBE_HOURS = 12.0

DEFAULT_TASK = "tabular"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InputError(message)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """A number as the user typed it (`-1`, not the parsed `-1.0`); anything else as it is."""
    return format(value, "g") if _is_number(value) else str(value)


@dataclass(frozen=True)
class TrainConfig:
    data: Path
    out: Path
    checkpoints: str
    epochs: int = 5
    seed: int = 0
    global_batch_size: int = 64
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 20
    task: str = DEFAULT_TASK
    task_options: dict[str, Any] = field(default_factory=dict)
    checkpoint_every_steps: int | None = None
    checkpoint_every_seconds: float | str | None = DEFAULT_CHECKPOINT_EVERY_SECONDS
    mtbe_hours: float = DEFAULT_MTBE_HOURS
    keep_checkpoints: int = 2
    deterministic: bool = False
    allow_data_change: bool = False
    device: str = "auto"
    progress: str = "auto"
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str = "retrain"
    mlflow_artifact_location: str | None = None

    def __post_init__(self) -> None:
        # The rules every room checks these parameters by (the configuration file, --param, the pre-run
        # check): one definition, core/train_rules.py.
        for name, rule in TRAIN_RULES.items():
            value = getattr(self, name)
            _require(rule.fits(value), f"{rule.flag} {_shown(value)}: expected {rule.expected}")
        _require(
            self.progress in PROGRESS_MODES,
            f"--progress {self.progress!r}: expected one of {', '.join(PROGRESS_MODES)}",
        )
        _require(
            isinstance(self.task, str) and bool(self.task.strip()),
            f"--task {self.task!r}: expected a built-in (tabular, image), path/to/file.py:Attr or "
            "package.module:Attr",
        )
        object.__setattr__(self, "task_options", _json_object(self.task_options))
        _require(bool(self.checkpoints), "--checkpoints: expected a folder or a Blob Storage URL")
        _require(
            "?" not in self.checkpoints,
            "--checkpoints: credentials in the URL (a SAS query string) are not accepted; use managed "
            "identity, or RETRAIN_STORAGE_CONNECTION_STRING for the emulator",
        )

    def trajectory(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in TRAJECTORY_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; what checkpoints and metadata record (tracking location excluded: it may hold a
        host name, and does not describe the run)."""
        values = asdict(self)
        for name in ("mlflow_tracking_uri", "mlflow_artifact_location"):
            values.pop(name)
        return {key: str(value) if isinstance(value, Path) else value for key, value in values.items()}


def _json_object(options: object) -> dict[str, Any]:
    """Task options as plain JSON values (what checkpoints record and compare), or a one-line refusal."""
    _require(
        isinstance(options, dict) and all(isinstance(key, str) for key in options),
        f'--task-options {options!r}: expected a JSON object such as {{"hidden_width": 128}}',
    )
    try:
        return json.loads(json.dumps(options, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise InputError(f"--task-options {options!r}: not representable as JSON ({error})") from None


def options_text(options: dict[str, Any]) -> str:
    """Task options as one canonical JSON object, for command lines and messages."""
    return json.dumps(options, sort_keys=True, separators=(",", ":"))


def _shown_option(name: str, value: object) -> str:
    return options_text(value) if name == "task_options" and isinstance(value, dict) else str(value)


def trajectory_mismatches(saved: dict[str, Any], current: TrainConfig) -> list[str]:
    """Human-readable differences between a checkpoint's trajectory options and the current ones."""
    return [
        f"--{name.replace('_', '-')} {_shown_option(name, getattr(current, name))} "
        f"(checkpoint: {_shown_option(name, saved.get(name))})"
        for name in TRAJECTORY_FIELDS
        if saved.get(name) != getattr(current, name)
    ]
