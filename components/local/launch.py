"""Start a step's process, and restart it after a preemption.

A step's command starts with `python`; locally that is this interpreter (`sys.executable`), and its folder
leads PATH, so whatever the step starts finds the same environment. A `distribution: pytorch` step runs
under torchrun (`python -m training.engine.torchrun_agent --standalone --nproc-per-node=N`: torchrun, made
to die with this runner), one intra-op thread per process (OMP_NUM_THREADS=1 unless the caller set it).

torchrun exits 1 whatever its workers' exit codes. It reports the failing worker's code through
torchelastic's error-file protocol: `["message"]["errorCode"]` of the file named by TORCHELASTIC_ERROR_FILE,
which then is the step's exit code. When torchrun is itself signalled (an eviction signals it as well as its
workers), it writes only its own exception there; the workers' own reports, under torchrun's `--log-dir`
(`<run>/attempt_<n>/<rank>/error.json`), then tell whether they were preempted.

Each step starts in its own session (its own process group): a Ctrl-C at the terminal reaches the runner
only, and the runner forwards SIGTERM/SIGINT to the running step, which saves and exits as on eviction.
Exit code 75 means preempted with the state saved: the step is started again (up to a cap) and resumes.
Exit code 65 means the training diverged (a loss that is not finite): it is not started again, since it
would diverge at the same step. Whatever the code, a failure quotes the failed worker's own one-line reason
from its report (training/engine/failure_report.py: a divergence, a bad input, a task breaking its
contract, a crash), not torchrun's ChildFailedError.
While a step runs, `<step folder>/pid` holds its process id (the torchrun launcher for a distributed step;
its workers are its children).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from components.errors import SpecError
from components.local.clock import Clock
from components.local.runs import STEP_PID_FILE, StepAttempt
from components.specs import Distribution
from core.secrets import mask_secrets
from core.warm_start import WARM_START_VARIABLE

log = logging.getLogger(__name__)

# The trainer's "preempted, state saved, start me again" code (EX_TEMPFAIL), as documented in train.yml.
PREEMPTED_EXIT_CODE = 75
# The trainer's "training diverged" code (EX_DATAERR), as documented in train.yml: a failure like any other,
# but one a restart cannot cure.
DIVERGED_EXIT_CODE = 65
TORCHRUN_AGENT = "training.engine.torchrun_agent"  # a module name: components never imports training.engine
_PYTHON_WORDS = ("python", "python3")


@dataclass(frozen=True)
class TorchrunReports:
    """Where torchrun and its workers report why they failed, for one distributed step."""

    error_file: Path  # torchrun's own TORCHELASTIC_ERROR_FILE
    log_dir: Path  # torchrun's --log-dir: each worker's error.json

    @classmethod
    def in_folder(cls, folder: Path) -> TorchrunReports:
        return cls(folder / "torchelastic-error.json", folder / "torchrun")

    def clear(self) -> None:
        """Forget an earlier attempt's reports: they must not speak for the next one."""
        self.error_file.unlink(missing_ok=True)
        shutil.rmtree(self.log_dir, ignore_errors=True)


def starts_as_module(command: str, distribution: Distribution | None) -> bool:
    """Whether a step's command starts as `python -m MODULE`, the only kind a warm start forks: a
    distributed step always does (torchrun's agent is such a module), another when its command says so."""
    words = command.split(None, 2)
    return distribution is not None or (len(words) >= 2 and words[0] in _PYTHON_WORDS and words[1] == "-m")


def launch_argv(
    argv: Sequence[str],
    distribution: Distribution | None,
    nproc: int,
    python: str,
    step: str,
    reports: TorchrunReports | None = None,
) -> list[str]:
    """`argv` with its leading `python` made this interpreter, under torchrun when distributed."""
    if not argv or argv[0] not in _PYTHON_WORDS:
        if distribution is not None:
            raise SpecError(
                f"step '{step}': a distributed command must start with `python` (torchrun replaces it); "
                f"got {shlex.join(argv)!r}"
            )
        return list(argv)
    if distribution is None:
        return [python, *argv[1:]]
    if distribution.type != "pytorch":
        raise SpecError(
            f"step '{step}': distribution type {distribution.type!r} cannot run locally; expected 'pytorch'"
        )
    # torchrun through its agent (training/engine/torchrun_agent.py), which the kernel kills when this
    # runner dies: its workers then see their parent gone, save at the agreed step and leave, instead of
    # training on as orphans beside the next attempt.
    torchrun = [python, "-m", TORCHRUN_AGENT, "--standalone", f"--nproc-per-node={nproc}"]
    if reports is not None:
        torchrun.append(f"--log-dir={reports.log_dir}")
    return [*torchrun, *argv[1:]]


def step_environment(
    environ: Mapping[str, str],
    state_root: Path,
    python: str,
    reports: TorchrunReports | None,
    pipeline_run: str,
    *,
    warm_start: bool,
) -> dict[str, str]:
    """The caller's environment, plus the state folder, the pipeline run's id (Azure ML names its job
    the same way, in AZUREML_ROOT_RUN_ID), this interpreter first on PATH, and for a distributed step one
    thread per process and torchrun's error file. With warm starts off, the step is told so too: its own
    launcher would otherwise fork torchrun's agent (core/warm_start.py)."""
    environment = dict(environ)
    if not warm_start:
        environment[WARM_START_VARIABLE] = "off"
    environment["RETRAIN_HOME"] = str(state_root)
    environment["RETRAIN_PIPELINE_RUN"] = pipeline_run
    bin_dir = str(Path(python).parent)
    environment["PATH"] = os.pathsep.join(part for part in (bin_dir, environ.get("PATH", "")) if part)
    if reports is not None:
        environment.setdefault("OMP_NUM_THREADS", "1")
        environment["TORCHELASTIC_ERROR_FILE"] = str(reports.error_file)
    return environment


def _report(path: Path) -> dict:
    try:
        message = json.loads(path.read_text())["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return message if isinstance(message, dict) else {}


def _reported_code(path: Path) -> int | None:
    code = _report(path).get("errorCode")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def reported_reason(reports: TorchrunReports | None, exit_code: int) -> str | None:
    """The first line of the reason a worker that exited with `exit_code` gave, from torchrun's error file
    or else from the workers' own; None when none gave one."""
    if reports is None:
        return None
    for path in [reports.error_file, *sorted(reports.log_dir.glob("**/error.json"))]:
        report = _report(path)
        reason = report.get("message")
        if report.get("errorCode") == exit_code and isinstance(reason, str) and reason.strip():
            return reason.strip().splitlines()[0]
    return None


def exit_code_from(returncode: int, reports: TorchrunReports | None) -> int:
    """The step's exit code: torchrun's, unless its error file names the failing worker's, or else every
    worker that reported names the same code."""
    if returncode == 0 or reports is None:
        return returncode
    reported = _reported_code(reports.error_file)
    if reported is not None:
        return reported
    workers = {_reported_code(path) for path in sorted(reports.log_dir.glob("**/error.json"))} - {None}
    return workers.pop() if len(workers) == 1 else returncode


class StepProcess(Protocol):
    @property
    def pid(self) -> int: ...

    def wait(self) -> int: ...

    def send_signal(self, signum: int) -> None: ...


class ProcessLauncher(Protocol):
    def start(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], log_file: Path
    ) -> StepProcess: ...


class _SessionProcess:
    """A process started in its own session; signals go to its whole process group."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    def wait(self) -> int:
        return self._process.wait()

    def send_signal(self, signum: int) -> None:
        if self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signum)
            except ProcessLookupError:
                log.debug("process group %d ended before signal %d arrived", self._process.pid, signum)


class SubprocessLauncher:
    """Runs each command as a real child process, its stdout and stderr appended to the log file."""

    def start(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], log_file: Path) -> StepProcess:
        with log_file.open("ab") as output:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return _SessionProcess(process)


@dataclass(frozen=True)
class StepLaunch:
    """Everything needed to start one step: its command, where, with what, and where its files go."""

    step: str
    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str]
    folder: Path
    reports: TorchrunReports | None

    @property
    def log_file(self) -> Path:
        return self.folder / "log.txt"

    @property
    def pid_file(self) -> Path:
        return self.folder / STEP_PID_FILE


ProcessStarted = Callable[[str, int, int], None]  # (step, attempt number, pid)


class StepExecutor:
    """Runs a step to its end, restarting it after preemptions, and relays stop signals to it."""

    def __init__(
        self,
        launcher: ProcessLauncher,
        clock: Clock,
        max_preemption_restarts: int,
        on_process_started: ProcessStarted | None = None,
    ) -> None:
        self._launcher = launcher
        self._clock = clock
        self._max_restarts = max_preemption_restarts
        self._on_process_started = on_process_started
        self._current: StepProcess | None = None
        self.stop_signal: int | None = None

    def request_stop(self, signum: int) -> None:
        """Forward `signum` to the running step, and start nothing new (also safe in a signal handler)."""
        self.stop_signal = signum
        current = self._current
        if current is not None:
            current.send_signal(signum)

    def execute(
        self, launch: StepLaunch, on_attempt: Callable[[StepAttempt], None], notify: Callable[[str], None]
    ) -> StepAttempt | None:
        """The last attempt; None if a stop was requested before the first one started."""
        number = 0
        while self.stop_signal is None:
            number += 1
            attempt = self._attempt(launch, number)
            on_attempt(attempt)
            if attempt.exit_code != PREEMPTED_EXIT_CODE or self.stop_signal is not None:
                return attempt
            if number > self._max_restarts:
                return attempt
            notify(
                f"preempted (exit {PREEMPTED_EXIT_CODE}) after {attempt.duration_s:.1f} s; "
                f"restarting (restart {number} of at most {self._max_restarts})"
            )
        return None

    def _attempt(self, launch: StepLaunch, number: int) -> StepAttempt:
        if launch.reports is not None:
            launch.reports.clear()
        with launch.log_file.open("a") as log_handle:
            log_handle.write(f"--- {launch.step} attempt {number}: {mask_secrets(shlex.join(launch.argv))}\n")
        started_at, started = self._clock.now(), self._clock.monotonic()
        process = self._launcher.start(launch.argv, launch.cwd, launch.env, launch.log_file)
        self._current = process
        if self.stop_signal is not None:  # a stop that arrived while the process was being started
            process.send_signal(self.stop_signal)
        try:
            launch.pid_file.write_text(f"{process.pid}\n")
            if self._on_process_started is not None:
                self._on_process_started(launch.step, number, process.pid)
            returncode = process.wait()
        except BaseException:
            process.send_signal(signal.SIGKILL)  # never leave a step running behind a failed runner
            process.wait()
            raise
        finally:
            self._current = None
            launch.pid_file.unlink(missing_ok=True)
        return StepAttempt(
            number=number,
            exit_code=exit_code_from(returncode, launch.reports),
            started_at=started_at,
            duration_s=round(self._clock.monotonic() - started, 3),
        )
