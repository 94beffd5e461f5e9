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

from core.errors import InputError, require
from core.flags import default_of, flag, number_text
from core.task_ref import options_text, written_options
from core.train_rules import AUTO_INTERVAL as AUTO_INTERVAL  # where the trainer's callers look for it
from core.train_rules import (
    CANDIDATE_AUTO,
    CANDIDATE_BEST,
    CANDIDATE_LAST,
    CANDIDATES,
    CHECKPOINT_LAYOUTS,
    OFF_WORDS,
    PRECISIONS,
    STRATEGIES,
    STRATEGY_DDP,
    STRATEGY_FSDP,
    TRAIN_RULES,
    read_interval,
    read_optional_count,
    read_precision,
    strategy_conflict,
)
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


def _optional_count(text: str) -> int | None:
    try:
        return read_optional_count(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, or 0 or 'off', got {text!r}") from None


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


_TASK, _DATA, _TRAINING, _VALIDATION, _CHECKPOINTS, _REPORTING = (
    "task",
    "data and outputs",
    "training",
    "validation and early stopping",
    "checkpoints",
    "reporting",
)
FLAG_GROUPS = (
    _TASK,
    _DATA,
    _TRAINING,
    _VALIDATION,
    _CHECKPOINTS,
    _REPORTING,
)  # their order in `retrain train --help`


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
    strategy: str = field(
        default=STRATEGY_DDP,
        metadata=flag(
            choices=STRATEGIES,
            group=_TRAINING,
            help="ddp: every process holds the whole model; fsdp: each holds a shard of the parameters, "
            "gradients and optimizer state (for models larger than one GPU)",
        ),
    )
    task: str = field(default=DEFAULT_TASK, metadata=task_flag(_TASK))
    task_options: dict[str, Any] = field(default_factory=dict, metadata=task_options_flag(_TASK))
    validate_every_epochs: int | None = field(
        default=None,
        metadata=flag(
            parse=_optional_count,
            none="off",
            metavar="N",
            group=_VALIDATION,
            help="score the validation split every N epochs, and at the last step ('off', 0: never)",
        ),
    )
    validate_every_steps: int | None = field(
        default=None,
        metadata=flag(
            parse=_optional_count,
            none="off",
            metavar="N",
            group=_VALIDATION,
            help="score the validation split every N steps, and at the last step ('off', 0: never); with "
            "--validate-every-epochs too, at the steps either names",
        ),
    )
    early_stopping_metric: str | None = field(
        default=None,
        metadata=flag(
            read=off_or_text,
            none="off",
            metavar="NAME",
            group=_VALIDATION,
            help="stop when validation_<a task metric> (e.g. validation_loss) has not improved, in the "
            "task's direction for it, for --early-stopping-patience validations; it also picks the best "
            "candidate ('off': no early stopping, the best is by the task's default primary metric)",
        ),
    )
    early_stopping_patience: int = field(
        default=3,
        metadata=flag(
            parse=int,
            metavar="N",
            group=_VALIDATION,
            help="validations without improvement before stopping (default %(default)s)",
        ),
    )
    early_stopping_min_delta: float = field(
        default=0.0,
        metadata=flag(
            parse=float,
            format=number_text,
            metavar="X",
            group=_VALIDATION,
            help="how much better than the best a validation must be to count as an improvement "
            "(default %(default)s)",
        ),
    )
    candidate: str = field(
        default=CANDIDATE_AUTO,
        metadata=flag(
            choices=CANDIDATES,
            group=_VALIDATION,
            help="the weights written to --out: the best validated step's, or the last step's; auto "
            "(default): best when validation is on, else last",
        ),
    )
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
    checkpoint_layout: str = field(
        default="auto",
        metadata=flag(
            choices=CHECKPOINT_LAYOUTS,
            group=_CHECKPOINTS,
            help="single: rank 0 writes one file; sharded: every process writes its shard, in parallel "
            "(resumable on another process count); auto (default): sharded under fsdp, single under ddp",
        ),
    )
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
            require(rule.fits(value), f"{rule.flag} {_shown(value)}: expected {rule.expected}")
        object.__setattr__(self, "precision", read_precision(self.precision))  # a TOML 32 is the name "32"
        require(
            self.progress in PROGRESS_MODES,
            f"--progress {self.progress!r}: expected one of {', '.join(PROGRESS_MODES)}",
        )
        require(
            isinstance(self.task, str) and bool(self.task.strip()),
            f"--task {self.task!r}: expected a built-in (tabular, image), path/to/file.py:Attr or "
            "package.module:Attr",
        )
        object.__setattr__(self, "task_options", _json_object(self.task_options))
        if self.early_stopping_metric is not None:
            object.__setattr__(self, "early_stopping_metric", self.early_stopping_metric.strip())
        self._check_validation()
        require(
            self.checkpoint_layout in CHECKPOINT_LAYOUTS,
            f"--checkpoint-layout {self.checkpoint_layout!r}: expected one of "
            f"{', '.join(CHECKPOINT_LAYOUTS)}",
        )
        conflict = strategy_conflict(self.strategy, self.checkpoint_layout, self.precision)
        require(conflict is None, f"options: {conflict}")
        require(bool(self.checkpoints), "--checkpoints: expected a folder or a Blob Storage URL")
        require(
            "?" not in self.checkpoints,
            "--checkpoints: credentials in the URL (a SAS query string) are not accepted; use managed "
            "identity, or RETRAIN_STORAGE_CONNECTION_STRING for the emulator",
        )

    def _check_validation(self) -> None:
        for name in ("validate_every_epochs", "validate_every_steps"):
            if getattr(self, name) == 0:  # 0 is off, as 'off' is: one value for it in checkpoints
                object.__setattr__(self, name, None)
        require(
            self.early_stopping_metric is None or self.validates,
            f"--early-stopping-metric {self.early_stopping_metric}: needs validation; add "
            "--validate-every-epochs N or --validate-every-steps N",
        )
        require(
            self.candidate != CANDIDATE_BEST or self.validates,
            "--candidate best: needs validation to pick the best step; add --validate-every-epochs N or "
            "--validate-every-steps N, or use --candidate last",
        )

    @property
    def sharded_checkpoints(self) -> bool:
        """Whether every rank writes its shard of each checkpoint (`auto` resolved)."""
        if self.checkpoint_layout == "auto":
            return self.strategy == STRATEGY_FSDP
        return self.checkpoint_layout == "sharded"

    @property
    def validates(self) -> bool:
        """Whether the run scores its validation split while it trains."""
        return self.validate_every_epochs is not None or self.validate_every_steps is not None

    @property
    def candidate_kind(self) -> str:
        """`best` or `last`: `auto` resolved."""
        if self.candidate != CANDIDATE_AUTO:
            return self.candidate
        return CANDIDATE_BEST if self.validates else CANDIDATE_LAST

    def trajectory(self) -> dict[str, Any]:
        """The trajectory options as checkpoint records hold them (a task secret as `***`: its value
        decides nothing a resume compares, core/task_ref.py)."""
        values = {name: getattr(self, name) for name in TRAJECTORY_FIELDS}
        return {**values, "task_options": written_options(self.task_options)}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; what checkpoints and metadata record (tracking location excluded: it may hold a
        host name, and does not describe the run; a task secret as `***`)."""
        values = asdict(self)
        for name in ("mlflow_tracking_uri", "mlflow_artifact_location"):
            values.pop(name)
        values["task_options"] = written_options(self.task_options)
        return {key: str(value) if isinstance(value, Path) else value for key, value in values.items()}


def _json_object(options: object) -> dict[str, Any]:
    """Task options as plain JSON values (what checkpoints record and compare), or a one-line refusal."""
    require(
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
    """Human-readable differences between a checkpoint's trajectory options and the current ones."""
    # A checkpoint from before an option existed was made with the option's default.
    defaults = {each.name: default_of(each) for each in fields(TrainConfig)}
    # Compared as written: a task secret is `***` on both sides (in a checkpoint from before secrets were
    # kept out of records too, whose value is then never shown).
    if isinstance(recorded := saved.get("task_options"), dict):
        saved = {**saved, "task_options": written_options(recorded)}
    values = current.trajectory()
    return [
        f"--{name.replace('_', '-')} {_shown_option(name, values[name])} "
        f"(checkpoint: {_shown_option(name, saved.get(name, defaults[name]))})"
        for name in TRAJECTORY_FIELDS
        if saved.get(name, defaults[name]) != values[name]
    ]
