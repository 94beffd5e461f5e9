"""`retrain plan scaling --measure`: time our own trainer's steady-state step on 1, 2, ..., P processes.

Each process count is a real `retrain train --nproc N` (torchrun for N > 1) on a prepared data version,
with the same global batch for every N, so a step does the same work whatever N is and only its split
and its gradient exchange change. Every count trains under the one `--strategy` measured (ddp: all-reduced
replicas; fsdp: shards gathered and reduce-scattered), and each run's metadata.json must say it did.
Checkpoints go to a temporary folder that is deleted afterwards; nothing is tracked in MLflow. The step
time comes from the trainer's own step events (`--progress jsonl`).

Launching sits behind `StepTimer`, so the orchestration is testable without starting processes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import statistics
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol, TextIO

from core.errors import InputError, RetrainError
from core.train_rules import STRATEGIES, STRATEGY_DDP
from training.engine.config import TrainConfig
from training.engine.supervise import StartCommand, TrainingProcess
from training.planning.maths import StepTime

log = logging.getLogger(__name__)
_ERROR_LINE = re.compile(r"(Error|error:|exitcode|Exception)\b")

DEFAULT_MAX_PROCS = 2
DEFAULT_STEPS = 60
_TRAINER_DEFAULTS = {field.name: field.default for field in fields(TrainConfig)}
# Measure the model people train: the tabular task's default width (a literal, as the task imports torch;
# tests/training/planning/test_planning_measure.py checks that the two agree).
DEFAULT_HIDDEN_WIDTH = 256
# The trainer's default global batch, rounded up to a multiple that splits evenly over 1..P processes.
BASE_GLOBAL_BATCH_SIZE: int = _TRAINER_DEFAULTS["global_batch_size"]
# Steps skipped before timing: start-up, first allocations, the learning-rate warm-up's first steps.
WARMUP_STEPS = 5
MIN_TIMED_STEPS = 5
STOP_GRACE_SECONDS = 60.0


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def default_global_batch_size(max_procs: int) -> int:
    """The smallest multiple of lcm(1..P) that is at least the trainer's default batch."""
    multiple = math.lcm(*range(1, max_procs + 1))
    return multiple * math.ceil(BASE_GLOBAL_BATCH_SIZE / multiple)


@dataclass(frozen=True)
class MeasureSettings:
    """What to measure; `global_batch_size` None picks `default_global_batch_size(max_procs)`."""

    max_procs: int = DEFAULT_MAX_PROCS
    steps: int = DEFAULT_STEPS
    global_batch_size: int | None = None
    hidden_width: int = DEFAULT_HIDDEN_WIDTH
    data: Path | None = None
    strategy: str = STRATEGY_DDP

    def __post_init__(self) -> None:
        if not (_whole(self.max_procs) and self.max_procs >= 2):
            raise InputError(
                f"--max-procs must be a whole number >= 2 (the fit needs two process counts or more), "
                f"got {self.max_procs!r}"
            )
        least = WARMUP_STEPS + MIN_TIMED_STEPS
        if not (_whole(self.steps) and self.steps >= least):
            raise InputError(
                f"--steps must be a whole number >= {least} (the first {WARMUP_STEPS} are warm-up, then at "
                f"least {MIN_TIMED_STEPS} are timed), got {self.steps!r}"
            )
        if not (_whole(self.hidden_width) and self.hidden_width >= 1):
            raise InputError(f"--hidden-width must be a whole number >= 1, got {self.hidden_width!r}")
        if self.strategy not in STRATEGIES:
            raise InputError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.global_batch_size is None:
            object.__setattr__(self, "global_batch_size", default_global_batch_size(self.max_procs))
        self._check_batch_splits(self.global_batch_size)

    def _check_batch_splits(self, batch: int) -> None:
        if not (_whole(batch) and batch >= 1):
            raise InputError(f"--global-batch-size must be a whole number >= 1, got {batch!r}")
        uneven = [n for n in range(1, self.max_procs + 1) if batch % n]
        if uneven:
            multiple = math.lcm(*range(1, self.max_procs + 1))
            raise InputError(
                f"--global-batch-size {batch} does not split evenly over {uneven[0]} processes; every count "
                f"1..{self.max_procs} trains the same global batch, so use a multiple of {multiple}"
            )


@dataclass(frozen=True)
class StepTiming:
    """The median steady-state seconds per step, over `timed_steps` steps; `strategy`: the one the trainer
    says it trained under (its metadata.json), where a real run was timed."""

    seconds: float
    timed_steps: int
    strategy: str | None = None


class StepTimer(Protocol):
    def time_step(self, processes: int) -> StepTiming: ...


def steady_step_timing(
    events: Iterable[Mapping[str, Any]], global_batch_size: int, warmup_steps: int = WARMUP_STEPS
) -> StepTiming:
    """The median of global batch / samples per second over the step events after `warmup_steps`.

    The trainer reports 0 samples per second until its own throughput meter has warmed up; those steps
    carry no timing and are skipped as well.
    """
    rates = [
        event["samples_per_second"]
        for event in events
        if event.get("event") == "step" and event["step"] > warmup_steps and event["samples_per_second"] > 0
    ]
    if len(rates) < MIN_TIMED_STEPS:
        raise RetrainError(
            f"the trainer reported {len(rates)} timed steps after {warmup_steps} warm-up steps; "
            f"expected at least {MIN_TIMED_STEPS}: raise --steps"
        )
    return StepTiming(statistics.median(global_batch_size / rate for rate in rates), len(rates))


def measure_step_times(timer: StepTimer, max_procs: int, progress: TextIO) -> tuple[StepTime, ...]:
    """Time 1, 2, ..., `max_procs` processes, one progress line per count."""
    points = []
    for processes in range(1, max_procs + 1):
        timing = timer.time_step(processes)
        under = f" under {timing.strategy}" if timing.strategy is not None else ""
        progress.write(
            f"measured {processes} of {max_procs} process counts{under}: {timing.seconds * 1000:.3f} ms per "
            f"step (median of {timing.timed_steps} steps)\n"
        )
        progress.flush()
        points.append(StepTime(processes, timing.seconds))
    return tuple(points)


# -- the real trainer -----------------------------------------------------------------------------------


def epochs_for(steps: int, train_rows: int, global_batch_size: int) -> int:
    """Whole epochs that give at least `steps` steps (the trainer drops each epoch's last partial batch)."""
    return math.ceil(steps / (train_rows // global_batch_size))


class TrainerStepTimer:
    """Runs `retrain train --nproc N` on a prepared data version and times its steady-state step; `start`
    starts it other than as a fresh process (training/engine/supervise.py's `StartCommand`)."""

    def __init__(
        self,
        data: Path,
        work: Path,
        settings: MeasureSettings,
        environ: Mapping[str, str],
        start: StartCommand | None = None,
    ) -> None:
        self._data = data
        self._work = work
        self._settings = settings
        self._start = start
        # One intra-op thread per process, as torchrun's workers get: N = 1 must not use every core while
        # N = 2 gets one each, or the curve would show thread contention rather than data parallelism.
        self._environ = {**environ, "OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS", "1")}
        from training.tasks.tabular.manifest import (
            read_manifest,  # pyarrow: too heavy for every `retrain` start
        )

        batch = settings.global_batch_size
        try:
            train_rows = read_manifest(data).split_rows("train")
        except InputError as error:
            raise InputError(f"--data: {error}") from None
        if batch > train_rows:
            raise InputError(
                f"--global-batch-size {batch} is larger than the training split of {data} ({train_rows} "
                f"rows); choose a smaller --global-batch-size or --max-procs"
            )
        self._epochs = epochs_for(settings.steps, train_rows, batch)

    def time_step(self, processes: int) -> StepTiming:
        run = self._work / f"nproc-{processes}"
        run.mkdir(parents=True)
        settings = self._settings
        arguments = [
            "--nproc", str(processes), "--data", str(self._data), "--out", str(run / "out"),
            "--checkpoints", str(run / "checkpoints"), "--epochs", str(self._epochs),
            "--global-batch-size", str(settings.global_batch_size),
            "--task-option", f"hidden_width={settings.hidden_width}", "--strategy", settings.strategy,
            "--checkpoint-every-steps", "off", "--checkpoint-every-seconds", "off", "--no-mlflow",
        ]  # fmt: skip
        log_path = run / "train.log"
        with log_path.open("w") as stderr:
            process = TrainingProcess(arguments, env=self._environ, stderr=stderr, start=self._start)
            try:
                with _forward_stop_signals(process) as received:
                    code = process.finish()
            except BaseException:
                _stop(process)
                raise
        if received:
            raise RetrainError(
                f"measuring {_processes(processes)}: interrupted by {received[0].name}; nothing was kept"
            )
        if code != 0:
            raise RetrainError(
                f"measuring {_processes(processes)}: `retrain train` exited with code {code}: "
                f"{_last_line(log_path)}"
            )
        timing = steady_step_timing(process.events_seen, settings.global_batch_size)
        strategy = _trained_under(run / "out", processes, settings.strategy)
        return StepTiming(timing.seconds, timing.timed_steps, strategy)


def _trained_under(out: Path, processes: int, strategy: str) -> str:
    """The strategy the finished run's metadata.json records, refused unless it is `strategy` on
    `processes` ranks: a curve of something other than what was asked is worse than none."""
    try:
        metadata = json.loads((out / "metadata.json").read_text())
        trained = (str(metadata["strategy"]), int(metadata["world_size"]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RetrainError(
            f"measuring {_processes(processes)}: the training's metadata.json cannot be read ({error})"
        ) from None
    if trained != (strategy, processes):
        raise RetrainError(
            f"measuring {_processes(processes)} under {strategy}: the training ran under {trained[0]} on "
            f"{_processes(trained[1])}"
        )
    return trained[0]


@contextmanager
def _forward_stop_signals(process: TrainingProcess) -> Iterator[list[signal.Signals]]:
    """Pass Ctrl-C and SIGTERM on as SIGTERM while the training runs: it runs in a session of its own,
    so neither reaches it otherwise, and a measurer that died alone would leave it training."""
    received: list[signal.Signals] = []
    if threading.current_thread() is not threading.main_thread():  # only there can handlers be set
        yield received
        return

    def forward(signum: int, _frame: object) -> None:
        received.append(signal.Signals(signum))
        process.send_signal(signal.SIGTERM)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop(process: TrainingProcess) -> None:
    if process.process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.process.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.process.wait()


def _processes(count: int) -> str:
    return "1 process" if count == 1 else f"{count} processes"


def _last_line(path: Path) -> str:
    """The line of the training's stderr that says why it failed: the last error line, else the last
    line that is not decoration (torchrun ends its failure report with a rule of '=')."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line.strip("=-") and not line.startswith("File ")]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    return (errors or lines or ["(no output)"])[-1]


def _prepare_sample(folder: Path) -> Path:
    from training.tasks.tabular.prepare import prepare
    from training.tasks.tabular.sample_data import write_sample_batches

    write_sample_batches(folder / "raw")
    prepare(folder / "raw", folder / "prepared")
    return folder / "prepared"


@contextmanager
def trainer_step_timer(settings: MeasureSettings, environ: Mapping[str, str]) -> Iterator[TrainerStepTimer]:
    """A timer over `settings.data`, or over the digits sample prepared in a temporary folder.

    Everything the runs write stays in that temporary folder, which is removed at the end.
    """
    if settings.data is not None and not settings.data.is_dir():
        raise InputError(f"--data {settings.data}: no such folder; expected a prepared data version")
    cpus = os.cpu_count() or 1
    if settings.max_procs > cpus:
        log.warning(
            "--max-procs %d exceeds the %d CPUs here: processes will share cores and the curve will show it",
            settings.max_procs,
            cpus,
        )
    with tempfile.TemporaryDirectory(prefix="retrain-measure-") as work:
        root = Path(work)
        data = settings.data.resolve() if settings.data is not None else _prepare_sample(root / "data")
        yield TrainerStepTimer(data, root, settings, environ)
