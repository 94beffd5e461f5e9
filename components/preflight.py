"""The preflight: the run's task loads, and its gate policy names only metrics the task reports, checked
before any data is pinned or any step started.

components/ imports neither torch nor training/, so the check runs where the steps run: as a process,
`python -m training.cli check-model` (training/gate/check.py), in the components' code folder and with
the caller's environment. A task that fails to load or lacks a part, and a gate metric the task does not
declare, are one line naming the task and what is wrong, raised as a SubmissionError; so is a trainer's
parameter the trainer would refuse (training/train_rules.py), checked here in-process. A passed check is
remembered for the same task file content, options and policy, so `retrain run` checking before it pins
the data and the runner checking again cost one process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from components.errors import SubmissionError
from components.run_inputs import GATE_INPUTS
from components.specs import REPO_ROOT
from training.errors import InputError
from training.train_rules import check_train_parameters

CHECK_COMMAND = ("-m", "training.cli", "check-model")
DEFAULT_WHERE = "the gate policy"
PREFLIGHT_TIMEOUT_S = 600.0  # a cold import of torch on a busy machine; the check itself is instant
_ERROR_PREFIX = "retrain: error: "


@dataclass(frozen=True)
class PreflightResult:
    """What the check found: the task's name, its raw file suffixes, its metrics and directions, and the
    primary metric the gate will compare."""

    task: str
    name: str
    raw_suffixes: tuple[str, ...]
    metrics: Mapping[str, str] = field(default_factory=dict)
    primary_metric: str = ""


class TaskRun(Protocol):
    """What the check reads of a run: a RunRequest, or components.run_settings.RunSettings before the
    data is pinned."""

    @property
    def task(self) -> str: ...

    @property
    def task_options_text(self) -> str: ...

    @property
    def task_sha256(self) -> str | None: ...

    @property
    def parameters(self) -> Mapping[str, Any]: ...


class Preflight(Protocol):
    def check(self, request: TaskRun, where: str = DEFAULT_WHERE) -> PreflightResult: ...


def check_arguments(request: TaskRun, where: str = DEFAULT_WHERE) -> list[str]:
    """The check's arguments: the request's task and options, and the gate inputs among its parameters."""
    arguments = ["--task", request.task, "--task-options", request.task_options_text, "--where", where]
    for name in GATE_INPUTS:
        if name in request.parameters:
            # As a step's command line spells a value (components/local/commands.format_value).
            arguments += [f"--{name.replace('_', '-')}", str(request.parameters[name])]
    return arguments


def check_parameter_values(request: TaskRun) -> None:
    """The trainer's parameters of the request, by the trainer's own rules (training/train_rules.py): a
    request that did not come through a checked configuration (a resubmission, a hand-made request) is
    refused here, before any data is pinned or step started, not by the trainer under torchrun."""
    try:
        check_train_parameters(request.parameters)
    except InputError as error:
        raise SubmissionError(f"preflight: {error}") from None


def _failure_line(stderr: str, returncode: int) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix(_ERROR_PREFIX) for line in lines if line.startswith(_ERROR_PREFIX)]
    if errors:
        return errors[-1]
    return lines[-1] if lines else f"the check exited with code {returncode} and said nothing"


class SubprocessPreflight:
    """Runs `python -m training.cli check-model` for a request; `python`, `code_root` and `environ` are
    those the steps get."""

    def __init__(
        self,
        python: str = sys.executable,
        code_root: Path = REPO_ROOT,
        environ: Mapping[str, str] | None = None,
        timeout_s: float = PREFLIGHT_TIMEOUT_S,
    ) -> None:
        self.python, self.code_root, self.timeout_s = python, Path(code_root), timeout_s
        self.environ = dict(environ) if environ is not None else None
        self._passed: dict[tuple[Any, ...], PreflightResult] = {}

    def check(self, request: TaskRun, where: str = DEFAULT_WHERE) -> PreflightResult:
        check_parameter_values(request)
        memo = (*check_arguments(request, ""), request.task_sha256)
        if memo in self._passed:
            return self._passed[memo]
        argv = [self.python, *CHECK_COMMAND, *check_arguments(request, where)]
        try:
            done = subprocess.run(
                argv,
                cwd=self.code_root,
                env=self.environ,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SubmissionError(
                f"preflight of task {request.task!r}: could not run the check ({error})"
            ) from None
        if done.returncode != 0:
            raise SubmissionError(f"preflight: {_failure_line(done.stderr, done.returncode)}")
        result = _parse(done.stdout, request.task)
        self._passed[memo] = result
        return result


def _parse(stdout: str, task: str) -> PreflightResult:
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        found = json.loads(lines[-1])
        return PreflightResult(
            task=found["task"],
            name=found["name"],
            raw_suffixes=tuple(found["raw_suffixes"]),
            metrics=dict(found["metrics"]),
            primary_metric=found["primary_metric"],
        )
    except (IndexError, ValueError, KeyError, TypeError):
        raise SubmissionError(
            f"preflight of task {task!r}: the check printed no result ({stdout.strip()[-200:]!r}); expected "
            "one JSON line from `python -m training.cli check-model`"
        ) from None
