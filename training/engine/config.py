"""The trainer's configuration: one frozen dataclass, validated at construction, whose fields are the
trainer's command-line flags too (core/flags.py: `retrain train`, the torchrun worker, components/train.yml).

Every validation error names the option and says what to use instead, because these objects are built
straight from command-line arguments and app settings.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.flags import flag, number_text
from core.task_ref import options_text
from core.train_rules import AUTO_INTERVAL as AUTO_INTERVAL  # where the trainer's callers look for it
from core.train_rules import OFF_WORDS, PRECISIONS, TRAIN_RULES, read_interval, read_precision
from core.trajectory import TRAJECTORY_FIELDS  # the options a checkpoint resumes only under
from training.tasks.task_flags import task_flag, task_options_flag

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


def _optional_whole(text: str) -> int | None:
    if text.lower() in OFF_WORDS:
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a int or 'off', got {text!r}") from None


def _number_or_off(text: str) -> float | None:
    if text.lower() in OFF_WORDS:
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'off', got {text!r}") from None


def _seconds_auto_or_off(text: str) -> float | str | None:
    try:
        return read_interval(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, '{AUTO_INTERVAL}' or 'off', got {text!r}"
        ) from None


def _interval_text(value: float | str) -> str:
    return value if isinstance(value, str) else number_text(value)  # 'auto', or seconds


def off_or_text(value: str | None) -> str | None:
    """A location flag's text: 'off' (any case) is none."""
    return None if value is None or value.lower() == "off" else value


_TASK, _DATA, _TRAINING, _CHECKPOINTS, _REPORTING = (
    "task",
    "data and outputs",
    "training",
    "checkpoints",
    "reporting",
)
FLAG_GROUPS = (_TASK, _DATA, _TRAINING, _CHECKPOINTS, _REPORTING)  # their order in `retrain train --help`


@dataclass(frozen=True)
class TrainConfig:
    """The trainer's options; each field is its command-line flag too (core/flags.py)."""

    data: Path = field(
        metadata=flag(parse=Path, group=_DATA, help="a prepared data version (retrain prepare)")
    )
    out: Path = field(metadata=flag(parse=Path, group=_DATA, help="folder for model.pt and metadata.json"))
    checkpoints: str = field(
        metadata=flag(
            group=_DATA,
            help="checkpoint folder, or https://<account>.blob.core.windows.net/<container>/<prefix>",
        )
    )
    epochs: int = field(default=5, metadata=flag(parse=int, group=_TRAINING))
    seed: int = field(default=0, metadata=flag(parse=int, group=_TRAINING))
    global_batch_size: int = field(
        default=64,
        metadata=flag(
            parse=int,
            group=_TRAINING,
            help="samples per step over all processes (kept when the world size changes)",
        ),
    )
    learning_rate: float = field(
        default=3e-3,
        metadata=flag(
            parse=float,
            format=number_text,
            group=_TRAINING,
            help="the default optimiser's (AdamW) peak learning rate; a task's own optimiser may follow it",
        ),
    )
    weight_decay: float = field(
        default=0.01,
        metadata=flag(parse=float, format=number_text, group=_TRAINING, help="AdamW's weight decay"),
    )
    warmup_steps: int = field(
        default=20,
        metadata=flag(
            parse=int, group=_TRAINING, help="steps of linear warm-up, then a cosine decay to a tenth"
        ),
    )
    grad_clip_norm: float | None = field(
        default=None,
        metadata=flag(
            parse=_number_or_off,
            format=number_text,
            none="off",
            metavar="X",
            group=_TRAINING,
            help="clip the gradients' total norm to X before each optimizer step ('off')",
        ),
    )
    accumulate_grad_batches: int = field(
        default=1,
        metadata=flag(
            parse=int,
            metavar="K",
            group=_TRAINING,
            help="reach the global batch in K micro-batches per process (less memory, same step)",
        ),
    )
    precision: str = field(
        default="32",
        metadata=flag(
            choices=PRECISIONS,
            group=_TRAINING,
            help="32; bf16-mixed (bfloat16 autocast, CPU or CUDA); 16-mixed (float16 autocast with a "
            "gradient scaler, CUDA only)",
        ),
    )
    task: str = field(default=DEFAULT_TASK, metadata=task_flag(_TASK))
    task_options: dict[str, Any] = field(default_factory=dict, metadata=task_options_flag(_TASK))
    checkpoint_every_steps: int | None = field(
        default=None,
        metadata=flag(
            parse=_optional_whole, none="off", group=_CHECKPOINTS, help="save every K steps ('off')"
        ),
    )
    checkpoint_every_seconds: float | str | None = field(
        default=DEFAULT_CHECKPOINT_EVERY_SECONDS,
        metadata=flag(
            parse=_seconds_auto_or_off,
            format=_interval_text,
            none="off",
            group=_CHECKPOINTS,
            help="save every T seconds; 'auto' measures the checkpoint cost at the first saves and takes "
            "Daly's optimum for it and --mtbe-hours; 'off'",
        ),
    )
    mtbe_hours: float = field(
        default=DEFAULT_MTBE_HOURS,
        metadata=flag(
            parse=float,
            format=number_text,
            metavar="M",
            group=_CHECKPOINTS,
            help="mean hours between evictions of the job (a node's / the node count), for "
            "--checkpoint-every-seconds auto (default %(default)s)",
        ),
    )
    keep_checkpoints: int = field(default=2, metadata=flag(parse=int, group=_CHECKPOINTS))
    deterministic: bool = field(
        default=False, metadata=flag(group=_TRAINING, help="use deterministic algorithms only")
    )
    allow_data_change: bool = field(
        default=False,
        metadata=flag(group=_CHECKPOINTS, help="resume a checkpoint made on another data version"),
    )
    device: str = field(default="auto", metadata=flag(choices=("auto", "cpu", "cuda"), group=_TRAINING))
    progress: str = field(
        default="auto",
        metadata=flag(
            choices=PROGRESS_MODES,
            group=_REPORTING,
            help="bar (terminal), log (job logs), jsonl (machine-readable, stdout), none",
        ),
    )
    mlflow_tracking_uri: str | None = field(
        default=None,
        metadata=flag(
            read=off_or_text,
            none="off",
            group=_REPORTING,
            help="MLflow store, or 'off' (default: $MLFLOW_TRACKING_URI, else SQLite in the state folder)",
        ),
    )
    mlflow_experiment: str = field(default="retrain", metadata=flag(group=_REPORTING))
    mlflow_artifact_location: str | None = field(
        default=None, metadata=flag(read=off_or_text, none="off", group=_REPORTING, help=argparse.SUPPRESS)
    )

    def __post_init__(self) -> None:
        # The rules every room checks these parameters by (the configuration file, --param, the pre-run
        # check): one definition, core/train_rules.py.
        for name, rule in TRAIN_RULES.items():
            value = getattr(self, name)
            _require(rule.fits(value), f"{rule.flag} {_shown(value)}: expected {rule.expected}")
        object.__setattr__(self, "precision", read_precision(self.precision))  # a TOML 32 is the name "32"
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


def _shown_option(name: str, value: object) -> str:
    return options_text(value) if name == "task_options" and isinstance(value, dict) else str(value)


def trajectory_mismatches(saved: dict[str, Any], current: TrainConfig) -> list[str]:
    """Human-readable differences between a checkpoint's trajectory options and the current ones. An option
    a checkpoint does not record is older than it, so the checkpoint was trained with its default."""
    defaults = {each.name: each.default for each in fields(TrainConfig)}
    return [
        f"--{name.replace('_', '-')} {_shown_option(name, getattr(current, name))} "
        f"(checkpoint: {_shown_option(name, saved.get(name, defaults[name]))})"
        for name in TRAJECTORY_FIELDS
        if saved.get(name, defaults[name]) != getattr(current, name)
    ]
