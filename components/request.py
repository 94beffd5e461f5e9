"""One retraining, as a value: what to train on, with what, where, and why; and the protocol that runs it.

A `RunRequest` is what the Function App (or `retrain submit`) hands to a `Submitter`. Everything that
makes the run reproducible is in it: the pinned data version, the component versions, the compute per
step and the process count. Its run key (model name + data version) names the logical run: the job name
derives from it, so the same data never trains twice. The checkpoint path derives from the checkpoint key,
the run key plus the options that decide the training (components/checkpoint_key.py), so a resubmission
resumes, and a run with other epochs keeps checkpoints of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from components.errors import SubmissionError
from components.task_ref import (
    DEFAULT_TASK,
    check_task_options,
    parse_task_reference,
    task_file_sha256,
)
from core.names import check_model_name
from core.task_ref import options_text
from core.versions import is_version

_TAG_KEY = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_STEP_NAMES = ("prep", "train", "evaluate", "register")
TRIGGER_TAG_PREFIX = "trigger."
# The tags that pin a run: `tags()` sets them, and no job tag may stand in for them.
# The raw data version (rd-) is `retrain.raw_version`; `retrain.data_version` is the prepared version (dv-),
# which the trainer tags its MLflow run with: a job tag of that name, as runs before the rename carried
# the raw one under it, would be read as the prepared version.
LINEAGE_TAGS = (
    "retrain.model_name",
    "retrain.raw_version",
    "retrain.data_version",
    "retrain.run_key",
    "retrain.attempt",
    "retrain.task",
    "retrain.task_sha256",
)

# Submission states, the same words Azure ML uses for jobs.
QUEUED, RUNNING, COMPLETED, FAILED, CANCELED = "Queued", "Running", "Completed", "Failed", "Canceled"
TERMINAL_STATES = frozenset({COMPLETED, FAILED, CANCELED})


@dataclass(frozen=True)
class DataRef:
    """A pinned data version and where it lives: a local folder, or `azureml:<asset>:<version>`."""

    version: str
    uri: str
    # The raw bytes the version holds (its manifest's sizes), where the pin knows them: the Azure ML builder
    # chooses the data input's mode by it (components/azureml/input_modes.py). None: unknown, Azure ML's
    # default.
    size_bytes: int | None = None

    def __post_init__(self) -> None:
        if not is_version(self.version):
            raise SubmissionError(
                f"data version {self.version!r}: expected a content-hashed version like 'rd-0123456789abcdef'"
            )
        if not self.uri:
            raise SubmissionError("data uri is empty; expected a folder or azureml:<asset>:<version>")
        if self.size_bytes is not None and (
            isinstance(self.size_bytes, bool) or not isinstance(self.size_bytes, int) or self.size_bytes < 0
        ):
            raise SubmissionError(
                f"data size {self.size_bytes!r}: expected the pinned files' bytes, a whole number >= 0"
            )


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class RunRequest:
    model_name: str
    data: DataRef
    trigger: Mapping[str, str] = field(default_factory=dict)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    processes_per_instance: int = 1
    instance_count: int = 1
    compute: Mapping[str, str] = field(default_factory=dict)
    component_versions: Mapping[str, str] = field(default_factory=dict)
    # More tags for the job, beside the lineage ones (the cost estimate): unlike `trigger`, they reach neither
    # the register step's --trigger argument nor a step's cache key, so an estimate never reruns a step.
    job_tags: Mapping[str, str] = field(default_factory=dict)
    # The model's task (components/task_ref.py; a task file by its absolute path) and its options. A task
    # file's code hash (the file and the modules of its folder it imports) is taken when the request is
    # made, as the data is pinned: it tags the job.
    task: str = DEFAULT_TASK
    task_options: Mapping[str, Any] = field(default_factory=dict)
    task_sha256: str | None = None
    # The prepared data version the prepare step builds on (its `previous_prepared` input): the model's last
    # good one, whose schema the run keeps and whose files it does not read again. A local folder for a
    # local run, an Azure ML URI (a datastore path) for a job; None: prepared from the raw data alone.
    previous_prepared: str | None = None

    def __post_init__(self) -> None:
        check_model_name(self.model_name, "model name", SubmissionError)
        if self.previous_prepared is not None and (
            not isinstance(self.previous_prepared, str) or not self.previous_prepared.strip()
        ):
            raise SubmissionError(
                f"previous prepared data {self.previous_prepared!r}: expected the folder or URI of an "
                "earlier prepared data version"
            )
        reference = parse_task_reference(self.task, None, "task")
        object.__setattr__(self, "task", reference.text)
        object.__setattr__(self, "task_options", check_task_options(self.task_options))
        if reference.path is not None and self.task_sha256 is None:
            object.__setattr__(self, "task_sha256", task_file_sha256(reference.path))
        if self.processes_per_instance < 1:
            raise SubmissionError(
                f"processes per instance {self.processes_per_instance}: expected a positive GPU count"
            )
        if self.instance_count < 1:
            raise SubmissionError(
                f"instance count {self.instance_count}: expected a positive number of nodes"
            )
        for label, mapping in (("compute", self.compute), ("component version", self.component_versions)):
            unknown = sorted(set(mapping) - set(_STEP_NAMES))
            if unknown:
                raise SubmissionError(f"{label} for {unknown}: expected steps among {list(_STEP_NAMES)}")
        bad_tags = sorted(key for key in self.trigger if not _TAG_KEY.fullmatch(key))
        if bad_tags:
            raise SubmissionError(f"trigger keys {bad_tags}: expected letters, digits, '_', '.' or '-'")
        _check_job_tags(self.job_tags)
        for name in ("trigger", "parameters", "compute", "component_versions", "job_tags", "task_options"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    @property
    def run_key(self) -> str:
        """The logical run: one model trained on one data version. Stable across resubmissions."""
        return f"{self.model_name}-{self.data.version}"

    def job_name(self, attempt: int = 0) -> str:
        """Azure ML job name: the run key, so Azure ML refuses a duplicate; resubmissions add `-rN`."""
        return job_name_for(self.model_name, self.data.version, attempt)

    @property
    def process_count(self) -> int:
        return self.processes_per_instance * self.instance_count

    @property
    def task_options_text(self) -> str:
        """The options as the pipeline's `task_options` input (JSON safe between single quotes)."""
        return options_text(self.task_options)

    def tags(self) -> dict[str, str]:
        """Lineage tags for the job: the trigger metadata plus what pins the run, its task included."""
        task = {"retrain.task": self.task}
        if self.task_sha256 is not None:
            task["retrain.task_sha256"] = self.task_sha256
        return {
            **{f"{TRIGGER_TAG_PREFIX}{key}": str(value) for key, value in self.trigger.items()},
            **self.job_tags,
            "retrain.model_name": self.model_name,
            "retrain.raw_version": self.data.version,
            "retrain.run_key": self.run_key,
            **task,
        }


def job_name_for(model_name: str, data_version: str, attempt: int = 0) -> str:
    """The job name of a run of `model_name` on `data_version`: a submitter finds a job by it, which is how
    the front door learns whether a submission that stopped half-way reached its submitter."""
    run_key = f"{model_name}-{data_version}"
    return f"retrain-{run_key}" if attempt == 0 else f"retrain-{run_key}-r{attempt}"


def _check_job_tags(tags: Mapping[str, str]) -> None:
    bad = sorted(
        str(key)
        for key, value in tags.items()
        if not isinstance(key, str) or not _TAG_KEY.fullmatch(key) or not isinstance(value, str)
    )
    if bad:
        raise SubmissionError(
            f"job tags {bad}: expected text keys of letters, digits, '_', '.' or '-' with text values"
        )
    taken = sorted(key for key in tags if key.startswith(TRIGGER_TAG_PREFIX) or key in LINEAGE_TAGS)
    if taken:
        raise SubmissionError(
            f"job tags {taken}: these name the trigger or the run's lineage; expected other keys"
        )


@dataclass(frozen=True)
class Submission:
    """What a submitter reports: the job it created (or found), on which backend, and its state."""

    job_name: str
    backend: str
    status: str
    run_key: str
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATES


class Submitter(Protocol):
    """Runs a `RunRequest` somewhere: Azure ML, this machine, or nowhere (dry run)."""

    def submit(self, request: RunRequest) -> Submission: ...

    def status(self, job_name: str) -> Submission: ...
