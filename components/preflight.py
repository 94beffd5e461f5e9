"""The preflight: the run's task loads, and its gate policy names only metrics the task reports, checked
before any data is pinned or any step started.

components/ imports neither torch nor training/, so the check runs where the steps run: as a process,
`python -m training.cli check-model` (training/gate/check_model.py), in the components' code folder and with
the caller's environment. A task that fails to load or lacks a part, a gate metric the task does not
declare, and an early-stopping metric it does not report (checked in-process against the metrics the check
found), are one line naming the task and what is wrong, raised as a SubmissionError (PreflightRefused:
the check ran and refused, so it always will for the same file, options and policy); so is a trainer's
or the gate's parameter that they would refuse (core/train_rules.py, core/gate_rules.py), checked here
in-process. A member of a per-class family (`recall_7`, `validation_recall_7`) is checked against the
task's class count: the one its options fix, else, where the caller has the run's raw data and only then,
the one that data holds (a second check with `--raw`, made only when a policy or an early-stopping metric
names such a member), so a class the model will never have is refused before anything trains. A passed
check is remembered for the same task file content, options and policy, so `retrain run` checking before
it pins the data and the runner checking again cost one process.
`RecordedPreflight` keeps the verdicts on a task file in a folder, so that the front door's flushes, each
perhaps in its own process, check a version of a user's task file once (function_app/task_check.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from components.errors import RunRefused, SubmissionError
from components.run_inputs import GATE_INPUTS
from components.specs import REPO_ROOT
from core.errors import InputError
from core.files import file_sha256, write_atomically
from core.gate_rules import check_gate_parameters
from core.metrics import Direction, Metric, MetricSet, configured_metrics
from core.task_ref import task_secrets_environment
from core.train_rules import VALIDATION_PREFIX, check_train_parameters, validation_metric

CHECK_COMMAND = ("-m", "training.cli", "check-model")
STOPPING_METRIC = "early_stopping_metric"
DEFAULT_WHERE = "the gate policy"
PREFLIGHT_TIMEOUT_S = 600.0  # a cold import of torch on a busy machine; the check itself is instant
_ERROR_PREFIX = "retrain: error: "
# The code whose rules decide a verdict: a recorded verdict is kept only while these files are unchanged.
CHECK_CODE = (
    "training/gate/check_model.py",
    "training/gate/policy.py",
    "core/metrics.py",
    "core/gate_rules.py",
    "training/tasks/base.py",
    "training/tasks/loader.py",
)


class PreflightRefused(RunRefused):
    """The check ran and refused the task or its gate policy (not: it could not run): the same task file
    content, options and policy are refused again, so the verdict may be kept; raised by a local run's
    pre-run check, nothing has run."""


@dataclass(frozen=True)
class PreflightResult:
    """What the check found: the task's name, its raw file suffixes, its metrics and directions (and which
    are per-class families), its class count when known, and the primary metric the gate will compare."""

    task: str
    name: str
    raw_suffixes: tuple[str, ...]
    metrics: Mapping[str, str] = field(default_factory=dict)
    primary_metric: str = ""
    per_class: tuple[str, ...] = ()
    class_count: int | None = None

    def metric_set(self) -> MetricSet:
        """The task's metrics as core/metrics.py reads them, its class count included."""
        declared = tuple(
            Metric(name, cast(Direction, direction), per_class=name in self.per_class)
            for name, direction in self.metrics.items()
        )
        return MetricSet(declared, self.class_count)


class TaskRun(Protocol):
    """What the check reads of a run: a RunRequest, or components.run_settings.RunSettings before the
    data is pinned."""

    @property
    def task(self) -> str: ...

    @property
    def task_options(self) -> Mapping[str, Any]: ...

    @property
    def task_options_text(self) -> str: ...

    @property
    def task_sha256(self) -> str | None: ...

    @property
    def parameters(self) -> Mapping[str, Any]: ...


class Preflight(Protocol):
    def check(self, request: TaskRun, where: str = DEFAULT_WHERE, raw: Path | None = None) -> PreflightResult:
        """The request's task and policy checked; `raw`, the run's raw data when the caller has it here,
        is read only if a per-class member needs the class count (see the module)."""
        ...


def check_arguments(request: TaskRun, where: str = DEFAULT_WHERE, raw: Path | None = None) -> list[str]:
    """The check's arguments: the request's task and options, the gate inputs among its parameters, and
    the raw data whose class count a per-class member is checked against."""
    arguments = ["--task", request.task, "--task-options", request.task_options_text, "--where", where]
    for name in GATE_INPUTS:
        if name in request.parameters:
            # As a step's command line spells a value (components/local/commands.format_value).
            arguments += [f"--{name.replace('_', '-')}", str(request.parameters[name])]
    return [*arguments, "--raw", str(raw)] if raw is not None else arguments


def needs_class_count(request: TaskRun, result: PreflightResult) -> bool:
    """Whether the request names one member of a per-class family (`recall_7` in its gate policy,
    `validation_recall_7` to stop early by) while the task's class count is not known without data."""
    if result.class_count is not None or not result.per_class:
        return False
    metrics = result.metric_set()
    try:
        named = [metric for _, metric in configured_metrics(request.parameters)]
    except InputError:
        named = []  # malformed bounds: the check itself refuses them
    stopping = request.parameters.get(STOPPING_METRIC)
    if isinstance(stopping, str):
        named.append(stopping.strip().removeprefix(VALIDATION_PREFIX))
    return any(metrics.per_class_member(name) is not None for name in named)


def check_parameter_values(request: TaskRun) -> None:
    """The trainer's and the gate's parameters of the request, by their own rules (core/train_rules.py,
    core/gate_rules.py): a request that did not come through a checked configuration (a resubmission, a
    hand-made request) is refused here, before any data is pinned or step started, not by the trainer
    under torchrun or the register step after a whole training."""
    try:
        check_train_parameters(request.parameters)
        check_gate_parameters(request.parameters)
    except InputError as error:
        raise PreflightRefused(f"preflight: {error}") from None


def check_stopping_metric(request: TaskRun, result: PreflightResult) -> None:
    """An early-stopping metric the task does not report, refused before any data is pinned (the trainer
    would refuse it only once its step starts): in-process, against the metrics the check found."""
    name = request.parameters.get(STOPPING_METRIC)
    if not isinstance(name, str) or name.strip().lower() in ("", "off", "none"):
        return
    try:
        validation_metric(name.strip(), result.metric_set(), result.name)
    except InputError as error:
        raise PreflightRefused(f"preflight: parameter {STOPPING_METRIC} is {name!r}: {error}") from None


def _failure_line(stderr: str, returncode: int) -> tuple[str, bool]:
    """The check's one-line reason, and whether it is the check's own refusal (its `retrain: error:`)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix(_ERROR_PREFIX) for line in lines if line.startswith(_ERROR_PREFIX)]
    if errors:
        return errors[-1], True
    return (lines[-1] if lines else f"the check exited with code {returncode} and said nothing"), False


class CommandRunner(Protocol):
    """Runs a command to its end, its output captured, as `subprocess.run` does (the local runner's warm
    starter does it too, components/local/warm.py)."""

    def run(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]: ...


class FreshProcess:
    """A fresh interpreter for each check."""

    def run(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
        )


class SubprocessPreflight:
    """Runs `python -m training.cli check-model` for a request; `python`, `code_root` and `environ` are
    those the steps get, and so is how it starts (`runner`: fresh, or forked warm as the steps are)."""

    def __init__(
        self,
        python: str = sys.executable,
        code_root: Path = REPO_ROOT,
        environ: Mapping[str, str] | None = None,
        timeout_s: float = PREFLIGHT_TIMEOUT_S,
        runner: CommandRunner | None = None,
    ) -> None:
        self.python, self.code_root, self.timeout_s = python, Path(code_root), timeout_s
        self.environ = dict(environ) if environ is not None else None
        self.runner = runner or FreshProcess()
        self._passed: dict[tuple[Any, ...], PreflightResult] = {}

    def check(self, request: TaskRun, where: str = DEFAULT_WHERE, raw: Path | None = None) -> PreflightResult:
        check_parameter_values(request)
        result = self._checked(request, where, None)
        if raw is not None and needs_class_count(request, result):
            result = self._checked(request, where, raw)
        check_stopping_metric(request, result)
        return result

    def _checked(self, request: TaskRun, where: str, raw: Path | None) -> PreflightResult:
        memo = (*check_arguments(request, "", raw), request.task_sha256)
        if memo in self._passed:
            return self._passed[memo]
        argv = [self.python, *CHECK_COMMAND, *check_arguments(request, where, raw)]
        try:
            environ = self.environ if self.environ is not None else dict(os.environ)
            # The options' secrets stand as `***` in the arguments, their values in the environment.
            environ = {**environ, **task_secrets_environment(request.task_options, environ)}
            done = self.runner.run(argv, self.code_root, environ, self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SubmissionError(
                f"preflight of task {request.task!r}: could not run the check ({error})"
            ) from None
        if done.returncode != 0:
            line, refused = _failure_line(done.stderr, done.returncode)
            raise (PreflightRefused if refused else SubmissionError)(f"preflight: {line}")
        result = _parse(done.stdout, request.task)
        self._passed[memo] = result
        return result


class RecordedPreflight:
    """A preflight whose verdicts on a task file are kept in `folder`, one file per version of the task
    file (its sha256), options, policy and check code: whichever process asks, a version is checked once,
    and a refusal is answered from the record, at no cost. A module task's verdict is kept when the request
    carries its sources' hash as task_sha256 (components/task_ref.task_code); a built-in's is not (its code
    is the snapshot's), nor a check that could not run (it says nothing of the task)."""

    def __init__(self, inner: Preflight, folder: Path, code_root: Path = REPO_ROOT) -> None:
        self._inner, self.folder = inner, Path(folder)
        self._code = hashlib.sha256(
            "\n".join(f"{name}={file_sha256(Path(code_root, name))}" for name in CHECK_CODE).encode()
        ).hexdigest()

    def check(self, request: TaskRun, where: str = DEFAULT_WHERE, raw: Path | None = None) -> PreflightResult:
        result = self._kept_check(request, where)
        if raw is not None and needs_class_count(request, result):
            # What the data holds is not the task file's verdict: asked anew, never kept.
            return self._inner.check(request, where, raw)
        return result

    def _kept_check(self, request: TaskRun, where: str) -> PreflightResult:
        if request.task_sha256 is None:
            return self._inner.check(request, where)
        key = json.dumps([self._code, request.task_sha256, *check_arguments(request, "")])
        path = self.folder / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
        recorded = _recorded(path)
        if recorded is not None and "refused" in recorded:
            raise PreflightRefused(str(recorded["refused"]))
        if recorded is not None:
            try:
                passed = _result(recorded["passed"])
            except (KeyError, TypeError):
                pass  # a damaged record: check again, and write it anew
            else:
                check_stopping_metric(request, passed)  # not part of the kept verdict's key
                return passed
        try:
            result = self._inner.check(request, where)
        except PreflightRefused as refusal:
            _keep(path, {"refused": str(refusal)})
            raise
        _keep(path, {"passed": {**asdict(result), "metrics": dict(result.metrics)}})
        return result  # the inner check has checked the early-stopping metric


def _keep(path: Path, verdict: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(verdict, sort_keys=True).encode())


def _recorded(path: Path) -> dict[str, Any] | None:
    """A kept verdict, or None: none kept, or one that does not read (then checked again)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _result(found: Mapping[str, Any]) -> PreflightResult:
    count = found.get("class_count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise TypeError(count)
    return PreflightResult(
        task=found["task"],
        name=found["name"],
        raw_suffixes=tuple(found["raw_suffixes"]),
        metrics=dict(found["metrics"]),
        primary_metric=found["primary_metric"],
        per_class=tuple(found.get("per_class", ())),
        class_count=count,
    )


def _parse(stdout: str, task: str) -> PreflightResult:
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        return _result(json.loads(lines[-1]))
    except (IndexError, ValueError, KeyError, TypeError):
        raise SubmissionError(
            f"preflight of task {task!r}: the check printed no result ({stdout.strip()[-200:]!r}); expected "
            "one JSON line from `python -m training.cli check-model`"
        ) from None
