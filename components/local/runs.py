"""Run records: what a local pipeline run did, step by step, kept as `<state>/runs/<run_id>/run.json`.

A record is written atomically (a temporary sibling, fsync, rename) every time a step changes state, so a
reader, such as `retrain runs` in another terminal, always sees a whole record.

A record names its runner, the process that runs it (components/local/liveness.py: host, pid and start).
A run still Queued or Running whose runner has ended (killed, however) can go no further: the first reader
that finds it so records it `Abandoned`, with its unfinished steps, and says which process was gone.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

from components.errors import PipelineError
from components.local.clock import SystemClock
from components.local.liveness import ProcessIdentity, start_token
from components.request import CANCELED, COMPLETED, FAILED, QUEUED, RUNNING
from core.files import write_atomically
from core.secrets import mask_secrets_in

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
STEP_PID_FILE = "pid"  # in a step's folder while its process runs: that process's id
# A run (or step) whose runner died before it ended: a run's own word, never a submission's (whose
# status the local submitter reports as Failed, with the reason).
ABANDONED = "Abandoned"
IN_PROGRESS = (QUEUED, RUNNING)
STEP_STATES = (QUEUED, RUNNING, COMPLETED, FAILED, CANCELED, ABANDONED)
_RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")


def new_run_id(created_at: str) -> str:
    """`YYYYmmdd-HHMMSS-<6 hex>` from the creation time: ids sort by age, and never collide in practice."""
    stamp = datetime.fromisoformat(created_at).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class StepAttempt:
    """One start of a step's process and how it ended."""

    number: int
    exit_code: int
    started_at: str
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "exit_code": self.exit_code,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepAttempt:
        return cls(
            int(data["number"]), int(data["exit_code"]), str(data["started_at"]), float(data["duration_s"])
        )


@dataclass(frozen=True)
class StepRecord:
    name: str
    component: str
    status: str = QUEUED
    reused: bool = False
    cache_key: str | None = None
    started_at: str | None = None
    duration_s: float | None = None
    outputs: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    attempts: tuple[StepAttempt, ...] = ()
    log: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STEP_STATES:
            raise PipelineError(f"step '{self.name}': status {self.status!r}; expected one of {STEP_STATES}")
        object.__setattr__(self, "outputs", _frozen(self.outputs))
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "attempts", tuple(self.attempts))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "component": self.component,
            "status": self.status,
            "reused": self.reused,
            "cache_key": self.cache_key,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "outputs": dict(self.outputs),
            "command": list(self.command),
            "attempts": [attempt.to_dict() for attempt in self.attempts],
            "log": self.log,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepRecord:
        return cls(
            name=str(data["name"]),
            component=str(data["component"]),
            status=str(data["status"]),
            reused=bool(data["reused"]),
            cache_key=data.get("cache_key"),
            started_at=data.get("started_at"),
            duration_s=data.get("duration_s"),
            outputs=dict(data.get("outputs") or {}),
            command=tuple(data.get("command") or ()),
            attempts=tuple(StepAttempt.from_dict(item) for item in data.get("attempts") or ()),
            log=data.get("log"),
        )


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    job_name: str
    run_key: str
    model_name: str
    data_version: str
    data_uri: str
    created_at: str
    steps: tuple[StepRecord, ...]
    status: str = RUNNING
    parameters: Mapping[str, str] = field(default_factory=dict)
    process_count: int = 1
    forced: bool = False
    finished_at: str | None = None
    outputs: Mapping[str, str] = field(default_factory=dict)
    failed_step: str | None = None
    error: str | None = None
    runner: ProcessIdentity | None = None  # None in a record written before runners were recorded

    def __post_init__(self) -> None:
        if not _RUN_ID.fullmatch(self.run_id):
            raise PipelineError(f"run id {self.run_id!r}: expected YYYYmmdd-HHMMSS-<6 hex digits>")
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "parameters", _frozen(self.parameters))
        object.__setattr__(self, "outputs", _frozen(self.outputs))

    def step(self, name: str) -> StepRecord:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def with_step(self, updated: StepRecord) -> RunRecord:
        return replace(
            self, steps=tuple(updated if step.name == updated.name else step for step in self.steps)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "job_name": self.job_name,
            "run_key": self.run_key,
            "model_name": self.model_name,
            "data_version": self.data_version,
            "data_uri": self.data_uri,
            "created_at": self.created_at,
            "status": self.status,
            "parameters": dict(self.parameters),
            "process_count": self.process_count,
            "forced": self.forced,
            "finished_at": self.finished_at,
            "outputs": dict(self.outputs),
            "failed_step": self.failed_step,
            "error": self.error,
            "runner": self.runner.to_dict() if self.runner is not None else None,
            "steps": [step.to_dict() for step in self.steps],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        return cls(
            run_id=str(data["run_id"]),
            job_name=str(data["job_name"]),
            run_key=str(data["run_key"]),
            model_name=str(data["model_name"]),
            data_version=str(data["data_version"]),
            data_uri=str(data["data_uri"]),
            created_at=str(data["created_at"]),
            status=str(data["status"]),
            parameters=dict(data.get("parameters") or {}),
            process_count=int(data.get("process_count", 1)),
            forced=bool(data.get("forced", False)),
            finished_at=data.get("finished_at"),
            outputs=dict(data.get("outputs") or {}),
            failed_step=data.get("failed_step"),
            error=data.get("error"),
            runner=ProcessIdentity.from_dict(data.get("runner")),
            steps=tuple(StepRecord.from_dict(item) for item in data["steps"]),
        )

    def abandoned(
        self, now: str, step_pid: Callable[[str], int | None] = lambda step: None
    ) -> RunRecord | None:
        """This record as `Abandoned` when it is still in progress but its runner has ended; else None.

        A record written before runners were recorded is judged by its running step's process, whose pid
        the runner keeps in the step's folder while it runs (`step_pid`): a model stuck on such a run
        before an upgrade is freed by the upgrade. Between two steps nothing tells, so it is left alone."""
        if self.status not in IN_PROGRESS:
            return None
        stopped = next((step.name for step in self.steps if step.status == RUNNING), None)
        if self.runner is not None:
            if self.runner.alive() is not False:
                return None
            owner = f"its runner ({self.runner.describe()})"
        else:
            if stopped is None:
                return None
            pid = step_pid(stopped)
            if pid is not None and start_token(pid) is not None:
                return None
            owner = "its step's process" + (f" (pid {pid})" if pid is not None else "")
        steps = tuple(
            replace(step, status=ABANDONED) if step.status in IN_PROGRESS else step for step in self.steps
        )
        where = f" during step '{stopped}'" if stopped else ""
        return replace(
            self,
            status=ABANDONED,
            steps=steps,
            finished_at=now,
            failed_step=stopped,
            error=f"abandoned{where}: {owner} ended before the run did",
        )


def write_json_atomically(path: Path, document: Mapping[str, Any]) -> None:
    """Readers see the old file or the new one, never a part; a record never holds a secret."""
    masked = mask_secrets_in(document)
    write_atomically(path, (json.dumps(masked, indent=2, sort_keys=True) + "\n").encode())


class RunStore:
    """The run records and step folders under `<state>/runs/`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    def step_dir(self, run_id: str, step: str) -> Path:
        return self.root / run_id / step

    def create(self, record: RunRecord) -> None:
        """Claim the run's folder (an existing one is an error: ids are never reused) and save it."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir(record.run_id).mkdir()
        self.save(record)

    def save(self, record: RunRecord) -> None:
        write_json_atomically(self.run_dir(record.run_id) / RUN_FILE, record.to_dict())

    def load(self, run_id: str) -> RunRecord:
        path = self.run_dir(run_id) / RUN_FILE
        try:
            record = RunRecord.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            raise PipelineError(
                f"run {run_id!r}: no record at {path}; `retrain runs` lists the runs"
            ) from None
        except (ValueError, KeyError, TypeError) as error:
            raise PipelineError(f"run record {path}: unreadable ({error}); expected a run.json") from None
        abandoned = record.abandoned(SystemClock().now(), lambda step: _pid_in(self.step_dir(run_id, step)))
        if abandoned is None:
            return record
        try:  # its runner is gone: nobody else writes this record any more
            self.save(abandoned)
        except OSError as error:  # a reader that may not write still sees the run as it is
            log.debug("run %s: cannot record it abandoned (%s)", run_id, error.strerror)
        else:
            log.warning("run %s: %s", run_id, abandoned.error)
        return abandoned

    def list(self, limit: int | None = None) -> list[RunRecord]:
        """Newest first. A folder that holds no readable record is skipped with a warning."""
        if not self.root.is_dir():
            return []
        records = []
        for folder in self.root.iterdir():
            if not (folder / RUN_FILE).is_file():
                continue
            try:
                records.append(self.load(folder.name))
            except PipelineError as error:
                log.warning("skipping %s: %s", folder, error)
        records.sort(key=lambda record: (record.created_at, record.run_id), reverse=True)
        return records if limit is None else records[:limit]


def _pid_in(step_folder: Path) -> int | None:
    """The pid the runner wrote for a step's process (`<step>/pid`, there while the step runs)."""
    try:
        return int((step_folder / STEP_PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
