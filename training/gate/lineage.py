"""What a registered model version carries about its origin, as `retrain.*` tags: one schema, both ways.

The register step writes these tags; `retrain models` and `retrain lineage` read them back. The chain they
describe runs from the version through the gate's decision and the pipeline job to the trigger event, the
raw and prepared data versions, the prepared data's manifest (its path and its sha256), and the task that
built the model (its reference, options and, for a task file, the file's sha256; for a user's task, file or
module, the hash of its code, the one the local runner's step cache keys on), which `retrain drift` reads
to compare the champion's own features.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import training
from core.errors import InputError
from core.files import file_sha256
from core.task_ref import options_text
from training.mlflow_names import names_of

log = logging.getLogger(__name__)

# The file at the top of a prepared data version that describes it (the built-in tasks write one); a data
# version without one is recorded by its folder and data version only.
MANIFEST_FILE = "manifest.json"

PREFIX = "retrain."
WEIGHTS_SHA256 = "retrain.weights_sha256"
TRAINING_RUN = "retrain.training_run_id"
TRIGGER = "retrain.trigger"
TRIGGER_KIND = "retrain.trigger.kind"
TRIGGER_EVENT_ID = "retrain.trigger.event_id"
# The raw data version (rd-) and the prepared one (dv-), under the names the job and the trainer's MLflow
# run use too. Versions registered before the rename carry them as retrain.data.raw_version and
# retrain.data.version: `tag` reads those as well.
RAW_DATA_VERSION = "retrain.raw_version"
DATA_VERSION = "retrain.data_version"
_FORMER_NAMES = {RAW_DATA_VERSION: "retrain.data.raw_version", DATA_VERSION: "retrain.data.version"}
MANIFEST_PATH = "retrain.data.manifest_path"
MANIFEST_SHA256 = "retrain.data.manifest_sha256"
DATA_DIR = "retrain.data.dir"
TASK_REF = "retrain.task"
TASK_NAME = "retrain.task.name"
TASK_OPTIONS = "retrain.task.options"  # JSON
TASK_FILE_SHA256 = "retrain.task.file_sha256"
TASK_CODE_SHA256 = "retrain.task.code_sha256"  # a task file's sha256, or a module task's package sources'
EVALUATED_ON = "retrain.data.evaluated_on"
CODE_VERSION = "retrain.code.version"
CODE_SOURCE = "retrain.code.source"
ENVIRONMENT_VERSION = "retrain.environment_version"
PIPELINE_JOB = "retrain.pipeline_job"
METRIC_PREFIX = "retrain.metric."
GATE_ACCEPTED = "retrain.gate.accepted"
GATE_REASONS = "retrain.gate.reasons"
GATE_POLICY = "retrain.gate.policy"
GATE_CHAMPION = "retrain.gate.champion_version"
# With a confidence: the primary metric's improvement, its bootstrap lower bound, the resamples and seed.
GATE_INTERVAL = "retrain.gate.interval"
REGISTERED_VERSION = "retrain.registered_version"
# The champion a version replaced when it took the alias: where `previous` goes after a rollback.
REPLACED_VERSION = "retrain.replaced_version"
ROLLBACK_REASON = "retrain.rollback.reason"
ROLLBACK_AT = "retrain.rollback.at"
ROLLBACK_TO = "retrain.rollback.to"

NONE = "none"
MANUAL = "manual"
_TRIGGER_KEY = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Trigger:
    """What started the run: 'manual', or the `key=value` pairs the pipeline passes (e.g. kind, event id)."""

    text: str
    fields: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    @classmethod
    def parse(cls, text: str) -> Trigger:
        """'manual' or `key=value[,key=value...]`; a value may itself contain ',' (it continues the value)."""
        text = text.strip()
        if text.lower() == MANUAL:
            return cls(MANUAL, {"kind": MANUAL})
        fields: dict[str, str] = {}
        last_key: str | None = None
        for part in text.split(","):
            key, separator, value = part.partition("=")
            if separator and _TRIGGER_KEY.fullmatch(key.strip()):
                last_key = key.strip()
                fields[last_key] = value
            elif last_key is not None:
                fields[last_key] += "," + part
            else:
                raise InputError(
                    f"--trigger {text!r}: expected 'manual' or KEY=VALUE[,KEY=VALUE...], "
                    "e.g. kind=blob,event_id=evt-42"
                )
        return cls(text, fields)

    @property
    def kind(self) -> str:
        return self.fields.get("kind") or self.fields.get("source") or "unspecified"

    @property
    def event_id(self) -> str:
        return self.fields.get("event_id") or NONE

    def tags(self) -> dict[str, str]:
        pairs = {f"{TRIGGER}.{key}": value for key, value in self.fields.items()}
        return {**pairs, TRIGGER: self.text, TRIGGER_KIND: self.kind, TRIGGER_EVENT_ID: self.event_id}


def code_version(package_dir: Path | None = None) -> tuple[str, str]:
    """('git', commit) when the package sits at the top of a git work tree, else ('package', version).

    Only the package's own work tree counts: an installed package inside some other repository (a virtual
    environment in a checkout) must not report that repository's commit.
    """
    package_dir = Path(package_dir or Path(training.__file__).parent).resolve()
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            cwd=package_dir.parent,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        log.debug("no git commit for %s: %s", package_dir, error)
        return "package", training.__version__
    lines = result.stdout.split()
    if result.returncode == 0 and len(lines) == 2 and Path(lines[0]).resolve() == package_dir.parent:
        return "git", lines[1]
    return "package", training.__version__


@dataclass(frozen=True)
class Lineage:
    """Everything a version's tags say about where it came from (none of it about the gate)."""

    trigger: Trigger
    raw_data_version: str
    data_version: str
    manifest_path: str
    manifest_sha256: str
    code_source: str
    code_version: str
    environment_version: str
    pipeline_job: str
    weights_sha256: str
    training_run_id: str
    data_dir: str = NONE
    task_ref: str = NONE
    task_name: str = NONE
    task_options: str = "{}"  # JSON
    task_file_sha256: str = NONE
    task_code_sha256: str = NONE

    def __post_init__(self) -> None:
        for name in ("raw_data_version", "environment_version"):
            if not getattr(self, name).strip():
                raise InputError(
                    f"--{name.replace('_', '-')} is empty; expected the version the pipeline pinned"
                )

    def tags(self) -> dict[str, str]:
        return {
            **self.trigger.tags(),
            RAW_DATA_VERSION: self.raw_data_version,
            DATA_VERSION: self.data_version,
            MANIFEST_PATH: self.manifest_path,
            MANIFEST_SHA256: self.manifest_sha256,
            CODE_SOURCE: self.code_source,
            CODE_VERSION: self.code_version,
            ENVIRONMENT_VERSION: self.environment_version,
            PIPELINE_JOB: self.pipeline_job,
            WEIGHTS_SHA256: self.weights_sha256,
            TRAINING_RUN: self.training_run_id,
            DATA_DIR: self.data_dir,
            TASK_REF: self.task_ref,
            TASK_NAME: self.task_name,
            TASK_OPTIONS: self.task_options,
            TASK_FILE_SHA256: self.task_file_sha256,
            TASK_CODE_SHA256: self.task_code_sha256,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "trigger": {
                "text": self.trigger.text,
                "kind": self.trigger.kind,
                "event_id": self.trigger.event_id,
            },
            "raw_version": self.raw_data_version,
            "data_version": self.data_version,
            "data_dir": self.data_dir,
            "manifest": {"path": self.manifest_path, "sha256": self.manifest_sha256},
            "task": {
                "ref": self.task_ref,
                "name": self.task_name,
                "options": json.loads(self.task_options),
                "file_sha256": self.task_file_sha256,
                "code_sha256": self.task_code_sha256,
            },
            "code": {"source": self.code_source, "version": self.code_version},
            "environment_version": self.environment_version,
            "pipeline_job": self.pipeline_job,
            "weights_sha256": self.weights_sha256,
            "training_run_id": self.training_run_id,
        }


def lineage_of(
    data_dir: Path,
    data_version: str,
    trigger: Trigger,
    raw_data_version: str,
    environment_version: str,
    pipeline_job: str | None,
    weights_sha256: str,
    training_run_id: str | None,
    task: Mapping[str, Any] | None = None,
) -> Lineage:
    """The lineage of a model trained on the prepared data in `data_dir`. `task` is the evaluation's task
    document: {"ref", "name", "options", "file_sha256", "code_sha256"}."""
    manifest = Path(data_dir) / MANIFEST_FILE
    has_manifest = manifest.is_file()
    source, version = code_version()
    task = task or {}
    return Lineage(
        trigger=trigger,
        raw_data_version=raw_data_version,
        data_version=data_version,
        manifest_path=str(manifest.resolve()) if has_manifest else NONE,
        manifest_sha256=file_sha256(manifest) if has_manifest else NONE,
        code_source=source,
        code_version=version,
        environment_version=environment_version,
        pipeline_job=pipeline_job or NONE,
        weights_sha256=weights_sha256,
        training_run_id=training_run_id or NONE,
        data_dir=str(Path(data_dir).resolve()),
        task_ref=str(task.get("ref") or NONE),
        task_name=str(task.get("name") or NONE),
        task_options=options_text(task.get("options") or {}),
        task_file_sha256=str(task.get("file_sha256") or NONE),
        task_code_sha256=str(task.get("code_sha256") or NONE),
    )


def tag(tags: Mapping[str, str], name: str) -> str | None:
    """A lineage tag's value, under its name or, for a version registered before the data versions were
    renamed, under its former one."""
    value = tags.get(name)
    return value if value is not None or name not in _FORMER_NAMES else tags.get(_FORMER_NAMES[name])


def metric_tags(metrics: Mapping[str, float]) -> dict[str, str]:
    return {f"{METRIC_PREFIX}{name}": repr(float(value)) for name, value in sorted(metrics.items())}


def metrics_from_tags(tags: Mapping[str, str]) -> dict[str, float]:
    """A version's metrics by their task's names: a tag key is the MLflow key of `retrain.metric.<name>`
    (training/mlflow_names.py), read back."""
    metrics = {}
    for key, name in names_of(tags).items():
        if name.startswith(METRIC_PREFIX):
            try:
                metrics[name.removeprefix(METRIC_PREFIX)] = float(tags[key])
            except ValueError:
                log.warning("tag %s=%r is not a number; left out", key, tags[key])
    return metrics


def decision_tags(decision: Mapping[str, Any], policy: Mapping[str, str]) -> dict[str, str]:
    """The gate's decision (Decision.to_dict()) and the policy it applied (GatePolicy.describe()); the
    interval it was held to, when it had one (a confidence, against a champion)."""
    tags = {
        GATE_ACCEPTED: str(bool(decision["accepted"])).lower(),
        GATE_REASONS: json.dumps(list(decision["reasons"])),
        GATE_CHAMPION: decision["champion_version"] or NONE,
        GATE_POLICY: json.dumps(dict(policy), sort_keys=True),
    }
    if decision.get("interval") is not None:
        tags[GATE_INTERVAL] = json.dumps(decision["interval"], sort_keys=True)
    return tags


def describe_tags(tags: Mapping[str, str]) -> dict[str, Any]:
    """A version's tags read back as the lineage chain, for `retrain models` and `retrain lineage`."""
    reasons = _json_tag(tags, GATE_REASONS)
    gate = {
        "accepted": tags.get(GATE_ACCEPTED) == "true",
        "reasons": reasons if isinstance(reasons, list) else [str(reasons)] if reasons else [],
        "champion_version": tags.get(GATE_CHAMPION),
        "policy": _json_tag(tags, GATE_POLICY),
    }
    if GATE_INTERVAL in tags:
        gate["interval"] = _json_tag(tags, GATE_INTERVAL)
    return {
        "gate": gate,
        "pipeline_job": tags.get(PIPELINE_JOB),
        "trigger": {
            "text": tags.get(TRIGGER),
            "kind": tags.get(TRIGGER_KIND),
            "event_id": tags.get(TRIGGER_EVENT_ID),
        },
        "raw_version": tag(tags, RAW_DATA_VERSION),
        "data_version": tag(tags, DATA_VERSION),
        "data_dir": tags.get(DATA_DIR),
        "task": task_from_tags(tags),
        "evaluated_on": tags.get(EVALUATED_ON),
        "manifest": {"path": tags.get(MANIFEST_PATH), "sha256": tags.get(MANIFEST_SHA256)},
        "code": {"source": tags.get(CODE_SOURCE), "version": tags.get(CODE_VERSION)},
        "environment_version": tags.get(ENVIRONMENT_VERSION),
        "weights_sha256": tags.get(WEIGHTS_SHA256),
        "training_run_id": tags.get(TRAINING_RUN),
        "replaced_version": tags.get(REPLACED_VERSION),
        "rollback": (
            {"reason": tags[ROLLBACK_REASON], "at": tags.get(ROLLBACK_AT), "to": tags.get(ROLLBACK_TO)}
            if ROLLBACK_REASON in tags
            else None
        ),
    }


def _json_tag(tags: Mapping[str, str], key: str) -> Any:
    """A tag holding JSON, parsed; a hand-edited tag that is not JSON is returned as its text."""
    text = tags.get(key)
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def task_from_tags(tags: Mapping[str, str]) -> dict[str, Any] | None:
    """The task a version records: {"ref", "name", "options", "file_sha256", "code_sha256"}; None for a
    version registered before tasks were recorded."""
    ref = tags.get(TASK_REF)
    if not ref or ref == NONE:
        return None
    options = _json_tag(tags, TASK_OPTIONS)
    return {
        "ref": ref,
        "name": tags.get(TASK_NAME),
        "options": options if isinstance(options, dict) else {},
        "file_sha256": None if tags.get(TASK_FILE_SHA256) in (None, NONE) else tags[TASK_FILE_SHA256],
        "code_sha256": None if tags.get(TASK_CODE_SHA256) in (None, NONE) else tags[TASK_CODE_SHA256],
    }
