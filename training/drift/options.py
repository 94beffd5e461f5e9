"""`retrain drift`'s config (components/drift.yml): a frozen dataclass whose fields are the command's
flags too (core/flags.py). Nothing here imports numpy or torch: the parser is built for every `retrain`
command, so the thresholds' defaults are DriftPolicy's (training/drift/check.py), filled in later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.flags import flag, number_text
from training.tasks.task_flags import task_options_flag

REPORT_FILE = "drift.json"
CHART_FILE = "drift_psi.png"
DEFAULT_EXPERIMENT = "retrain-drift"
_POLICY_DEFAULT = "default: DriftPolicy's, training/drift/check.py"
_THRESHOLDS = "thresholds"
POLICY_FIELDS = ("psi_threshold", "ks_pvalue", "min_drifted_features", "bins")


@dataclass(frozen=True, kw_only=True)  # keyword-only: the fields (and flags) in the order of --help
class DriftConfig:
    model_name: str = field(metadata=flag(help="the registered model whose data is checked"))
    current: Path = field(
        metadata=flag(parse=Path, metavar="DIR", help="folder of newly arrived raw batch files")
    )
    reference: Path | None = field(
        default=None,
        metadata=flag(
            parse=Path,
            metavar="DIR",
            help="a prepared data version to compare with (default: the champion's, from its lineage)",
        ),
    )
    task: str | None = field(
        default=None,
        metadata=flag(
            metavar="REF",
            help="the task whose drift features are compared: tabular, image, file.py:Attr, pkg.mod:Attr "
            "(default: the champion's, from its lineage; else tabular)",
        ),
    )
    task_options: dict[str, Any] = field(
        default_factory=dict, metadata=task_options_flag(help_text="the task's options as a JSON object")
    )
    psi_threshold: float | None = field(
        default=None,
        metadata=flag(
            parse=float,
            format=number_text,
            metavar="NUMBER",
            group=_THRESHOLDS,
            help=f"a feature's PSI above it drifts ({_POLICY_DEFAULT})",
        ),
    )
    ks_pvalue: float | None = field(
        default=None,
        metadata=flag(
            parse=float,
            format=number_text,
            metavar="P",
            group=_THRESHOLDS,
            help=f"...and its KS p-value below it ({_POLICY_DEFAULT})",
        ),
    )
    min_drifted_features: int | None = field(
        default=None,
        metadata=flag(
            parse=int,
            metavar="N",
            group=_THRESHOLDS,
            help=f"drifted features that raise an alert ({_POLICY_DEFAULT})",
        ),
    )
    bins: int | None = field(
        default=None,
        metadata=flag(
            parse=int, metavar="N", group=_THRESHOLDS, help=f"PSI quantile bins ({_POLICY_DEFAULT})"
        ),
    )
    out: Path | None = field(
        default=None,
        metadata=flag(
            parse=Path,
            metavar="DIR",
            help=f"folder for {REPORT_FILE} and {CHART_FILE} (default: <state>/drift/<check id>)",
        ),
    )
    publish: bool | None = field(
        default=None,
        metadata=flag(
            help="publish the drift event on an alert (default: when RETRAIN_DRIFT_TOPIC_ENDPOINT is set)"
        ),
    )
    mlflow_tracking_uri: str | None = field(
        default=None,
        metadata=flag(
            metavar="URI",
            help="MLflow store for the check and the registry, or 'off' "
            "(default: $MLFLOW_TRACKING_URI, else SQLite in the state folder)",
        ),
    )
    mlflow_experiment: str = field(
        default=DEFAULT_EXPERIMENT,
        metadata=flag(help=f"experiment of the check's run ({DEFAULT_EXPERIMENT})"),
    )

    def __post_init__(self) -> None:
        if self.task is None and self.task_options:
            raise InputError(
                "--task-options/--task-option: give --task too (or neither: the champion's task)"
            )

    def policy_given(self) -> dict[str, Any]:
        """The thresholds given, as DriftPolicy's keyword arguments (the rest: its defaults)."""
        return {name: getattr(self, name) for name in POLICY_FIELDS if getattr(self, name) is not None}
