"""The configs of the gate's pipeline steps, `retrain evaluate` and `retrain register`, and of the gate
policy they and `retrain prepare` take: frozen dataclasses whose fields are the commands' flags too
(core/flags.py; components/{evaluate,register,prep}.yml pass them).

Nothing here imports torch: the parser is built for every `retrain` command.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.flags import boolean_text, flag, number_text, read_boolean
from core.gate_rules import AS_FLAGS, CONFIDENCE, DEFAULT_RESAMPLES, GATE_RULES, resampling_conflict
from training.tasks.task_flags import task_options_flag

DEFAULT_MODEL_NAME = "digits"
LOCKS_FOLDER = "locks"
# The gate pulls in torch; the parser is built for every `retrain` command, so defaults are filled in later.
_GATE_DEFAULT = "default or 'default': the task's, training/gate/policy.py task_defaults"
TRACKING_HELP = (
    "MLflow tracking and registry store (default: $MLFLOW_TRACKING_URI, else SQLite in the state folder)"
)
MODEL_NAME_HELP = "the registered model's name"
# `retrain serve` (training/gate/scoring_server.py): loopback, so a scoring server is opened to a network
# only on purpose; MLflow's own default port; one server process.
DEFAULT_HOST, DEFAULT_PORT, DEFAULT_WORKERS = "127.0.0.1", 5000, 1
# The paired bootstrap behind the gate's confidence (training/gate/bootstrap.py): its resamples by default
# (core/gate_rules.py says why so many) and its seed.
BOOTSTRAP_RESAMPLES = DEFAULT_RESAMPLES
BOOTSTRAP_SEED = 0


def _improvement(text: str) -> float | None:
    if text.strip().lower() == "default":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'default', got {text!r}") from None


def _confidence_text(text: str) -> float | None:
    if text.strip().lower() in ("default", "none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {GATE_RULES[CONFIDENCE].expected}, or 'none', got {text!r}"
        ) from None


def _confidence(value: float | None) -> float | None:
    """A confidence as the gate takes it, refused in one line by the rule every room checks by."""
    rule = GATE_RULES[CONFIDENCE]
    if value is not None and not rule.fits(value):
        raise InputError(f"--confidence {value}: expected {rule.expected}")
    return value


def _whole_at_least(low: int, option: str):
    def read(value: int) -> int:
        if value < low:
            raise InputError(f"{option} {value}: expected a whole number >= {low}")
        return value

    return read


_PRIMARY_METRIC = flag(metavar="METRIC", help=f"one of the task's metrics ({_GATE_DEFAULT})")
_CONFIDENCE = flag(
    parse=_confidence_text,
    read=_confidence,
    format=number_text,
    metavar="NUMBER",
    help="promote only when a paired bootstrap of the test split puts the primary metric's improvement "
    "above --min-improvement with this confidence, such as 0.95 (default: none, the margin alone)",
)
_TASK = flag(
    metavar="REF",
    help="the model's task: tabular, image, file.py:Attr or pkg.mod:Attr "
    "(default: the one the model file records; a different one is refused)",
)
_TASK_OPTIONS = task_options_flag(help_text="the task's options as a JSON object (with --task)")
TASK_OPTION_HELP = "one task option, over --task-options (repeatable)"


@dataclass(frozen=True)
class GatePolicyOptions:
    """The gate policy's parts given on the command line; None: the task's default
    (training.gate.policy.policy_for_task)."""

    primary_metric: str | None = field(default=None, metadata=_PRIMARY_METRIC)
    min_improvement: float | None = field(
        default=None,
        metadata=flag(
            parse=_improvement,
            format=number_text,
            metavar="NUMBER",
            help=f"how much the primary metric must beat the champion's by, absolute ({_GATE_DEFAULT})",
        ),
    )
    floors: str | None = field(
        default=None,
        metadata=flag(
            metavar="METRIC=NUMBER,...", help=f"bounds for every candidate, or 'none' ({_GATE_DEFAULT})"
        ),
    )
    max_regression: str | None = field(
        default=None,
        metadata=flag(
            metavar="METRIC=NUMBER,...",
            help="how much worse than the champion a metric may get; a family such as 'recall_*' covers "
            f"each member ({_GATE_DEFAULT})",
        ),
    )
    first_model_floors: str | None = field(
        default=None,
        metadata=flag(metavar="METRIC=NUMBER,...", help=f"what the first model must meet ({_GATE_DEFAULT})"),
    )
    bootstrap_unloadable_champion: bool = field(
        default=False,
        metadata=flag(
            parse=read_boolean,
            format=boolean_text,
            optional_value=True,
            metavar="true|false",
            help="let a candidate meeting the first-model floors replace a champion that cannot be loaded",
        ),
    )
    confidence: float | None = field(default=None, metadata=_CONFIDENCE)

    def given(self) -> dict[str, Any]:
        """The parts as training.gate.policy.policy_of's keyword arguments."""
        return asdict(self)


def _check_task(task: str | None, options: dict[str, Any]) -> None:
    if task is None and options:
        raise InputError("--task-options/--task-option: give --task too, or neither (the model's own)")


@dataclass(frozen=True, kw_only=True)  # keyword-only: the fields (and flags) in the order of --help
class EvaluateConfig:
    """`retrain evaluate`: score a candidate and the champion on the same test split; with the gate's
    confidence, on the same resamples of it too (the paired bootstrap the register step reads)."""

    model: Path = field(metadata=flag(parse=Path, help="a training's output folder"))
    data: Path = field(metadata=flag(parse=Path, help="the prepared data version it trained on"))
    out: Path = field(metadata=flag(parse=Path, help="folder for evaluation.json"))
    task: str | None = field(default=None, metadata=_TASK)
    task_options: dict[str, Any] = field(default_factory=dict, metadata=_TASK_OPTIONS)
    model_name: str = field(metadata=flag(help=MODEL_NAME_HELP))
    mlflow_tracking_uri: str | None = field(default=None, metadata=flag(help=TRACKING_HELP))
    # The gate's parts that say what to resample; the register step takes the same values.
    primary_metric: str | None = field(default=None, metadata=_PRIMARY_METRIC)
    confidence: float | None = field(default=None, metadata=_CONFIDENCE)
    bootstrap_resamples: int = field(
        default=BOOTSTRAP_RESAMPLES,
        metadata=flag(
            parse=int,
            read=_whole_at_least(1, "--bootstrap-resamples"),
            metavar="N",
            help="paired resamples of the test split, with --confidence: at least 1/(1-confidence) - 1 "
            "(19 at 0.95), for the bound's quantile to lie among them",
        ),
    )
    bootstrap_seed: int = field(
        default=BOOTSTRAP_SEED,
        metadata=flag(
            parse=int,
            read=_whole_at_least(0, "--bootstrap-seed"),
            metavar="SEED",
            help="the seed the resamples are drawn from, recorded with them",
        ),
    )

    def __post_init__(self) -> None:
        _check_task(self.task, self.task_options)
        # Refused before anything is loaded: these resamples could never certify at this confidence.
        conflict = resampling_conflict(self.confidence, self.bootstrap_resamples, AS_FLAGS)
        if conflict is not None:
            raise InputError(conflict)


@dataclass(frozen=True, kw_only=True)
class RegisterConfig:
    """`retrain register`: gate an evaluated candidate; register it if it passes."""

    model: Path = field(metadata=flag(parse=Path, help="a training's output folder"))
    evaluation: Path = field(metadata=flag(parse=Path, help="the evaluate step's output folder"))
    data: Path = field(metadata=flag(parse=Path, help="the prepared data version it trained on"))
    trigger: str = field(default="manual", metadata=flag(help="'manual' or KEY=VALUE,... (kind, event_id)"))
    raw_data_version: str = field(metadata=flag(help="the pinned raw data version (rd-...)"))
    environment_version: str = field(metadata=flag(help="the training environment's version"))
    out: Path = field(metadata=flag(parse=Path, help="folder for registration.json"))
    mlflow_experiment: str = field(default="retrain", metadata=flag(help="experiment of the registering run"))
    task: str | None = field(default=None, metadata=_TASK)
    task_options: dict[str, Any] = field(default_factory=dict, metadata=_TASK_OPTIONS)
    model_name: str = field(metadata=flag(help=MODEL_NAME_HELP))
    mlflow_tracking_uri: str | None = field(default=None, metadata=flag(help=TRACKING_HELP))
    lock: str | None = field(
        default=None,
        metadata=flag(
            help="where the registry lock lives: a folder, or https://<account>.blob.core.windows.net/"
            f"<container>[/<prefix>] for a blob lease (default: <state folder>/{LOCKS_FOLDER})"
        ),
    )
    lock_wait: float = field(
        default=600.0,
        metadata=flag(
            parse=float, format=number_text, metavar="SECONDS", help="how long to wait for the lock"
        ),
    )
    policy: GatePolicyOptions = field(default_factory=GatePolicyOptions, metadata=flag(group="gate policy"))

    def __post_init__(self) -> None:
        _check_task(self.task, self.task_options)
