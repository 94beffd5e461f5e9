"""Run the pipeline on this machine: the components' own commands, in dependency order, with step reuse.

Layout under the state folder (`$RETRAIN_HOME`, default `./.retrain`):

    runs/<run_id>/run.json            the run's record, rewritten atomically as steps progress
    runs/<run_id>/<step>/log.txt      the step's stdout and stderr (and `pid` while it runs)
    data/<model>/<version>/           a pinned raw data version, read-only, with <version>.manifest.json
                                      beside it; checked against that manifest before a run reads it
    cache/<step>/<key>/<output>/      immutable step outputs, reused by later runs (cache.py); an entry
                                      changed since it was published is set aside as .damaged-<key>-*
    cache/<step>/.staging-<run_id>-*/ a step's outputs while it runs; a killed run's are removed by the
                                      next run once no process of it is left (staging.py)
    checkpoints/<checkpoint key>/     the train step's checkpoints, durable across reruns of one training
                                      (components/checkpoint_key.py: the run key, and a digest of the
                                      epochs, seed, batch size, learning rate, task and task options)
    locks/checkpoints/<key>.lock      held by the run that trains into checkpoints/<key>/

Steps run one at a time in the pipeline's dependency order; the first failure stops the run. The task's
code is pinned as the run starts (a task file's, with the modules of its folder it imports, was hashed with
the request; a module task's package sources are hashed here, and the request carries that hash as its
task_sha256, so cache and checkpoint keys and the preflight's memo follow the module's code); each step
checks it is still that code (execution.py).

Runs may go on side by side on one state folder, except two that would write one durable folder (the same
training of the same data): the second waits, saying for which run, until the first has ended, then runs,
reusing what the first left in the cache. The lock is an flock, which the kernel drops when its holder
dies. Runs that differ in a checkpoint key (other epochs, say) share no durable folder and do not wait.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from components.data_version import check_pinned
from components.errors import SubmissionError
from components.local.cache import StepCache
from components.local.clock import Clock, SystemClock
from components.local.commands import format_value
from components.local.execution import LocalStepFailed, PipelineExecution, RunContext
from components.local.launch import (
    ProcessLauncher,
    ProcessStarted,
    StepExecutor,
    SubprocessLauncher,
    starts_as_module,
)
from components.local.liveness import ProcessIdentity
from components.local.options import RunnerOptions
from components.local.plan import durable_outputs, durable_path, pipeline_values
from components.local.runs import RunRecord, RunStore, StepRecord, new_run_id
from components.local.staging import sweep_staging
from components.local.starter_pool import IDLE_STARTERS
from components.local.warm import WarmLauncher
from components.preflight import Preflight, SubprocessPreflight
from components.request import RunRequest
from components.run_inputs import TASK_INPUT
from components.specs import PipelineSpec, load_pipeline_spec
from components.task_ref import TaskCode, parse_task_reference, task_code
from core.storage.local import exclusive_file_lock

__all__ = ["LocalRunner", "LocalStepFailed", "RunnerOptions"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_NAME_WIDTH = 9
LOCKS_FOLDER = "locks"


class LocalRunner:
    """Runs a `RunRequest` through the pipeline's steps on this machine, synchronously."""

    def __init__(
        self,
        options: RunnerOptions,
        environ: Mapping[str, str],
        progress: TextIO,
        launcher: ProcessLauncher | None = None,
        clock: Clock | None = None,
        on_process_started: ProcessStarted | None = None,
        preflight: Preflight | None = None,
    ) -> None:
        self.options = options
        self.environ = dict(environ)
        self._preflight = preflight
        self._progress = progress
        if launcher is None:
            launcher = SubprocessLauncher()
            if options.warm_start:
                # Its starter, idle between runs, is kept for this process's next run (starter_pool.py).
                launcher = WarmLauncher(options.python, fallback=launcher, pool=IDLE_STARTERS)
        self._launcher = launcher
        self._kept_warm = False  # within `warm()`: the starter outlives each run
        self.clock = clock or SystemClock()
        self._on_process_started = on_process_started
        self.runs = RunStore(options.state_root / "runs")
        self.cache = StepCache(options.state_root / "cache")

    def run(self, request: RunRequest, force_rerun: bool = False) -> RunRecord:
        """Run every step; the record of a Completed or Canceled run. A failed step raises StepFailed."""
        pipeline = load_pipeline_spec(self.options.pipeline_file)
        _check_component_versions(pipeline, request)
        if not Path(request.data.uri).is_dir():
            raise SubmissionError(
                f"data {request.data.uri!r}: not a local folder; local runs read a pinned local copy "
                "(`retrain run --data FOLDER` makes one)"
            )
        check_pinned(Path(request.data.uri))  # a pinned copy changed since is refused, never read
        if self._kept_warm:
            return self._run(pipeline, request, force_rerun)
        with self.warm(pipeline):  # its imports overlap the checks below
            return self._run(pipeline, request, force_rerun)

    @contextmanager
    def warm(self, pipeline: PipelineSpec | None = None) -> Iterator[None]:
        """Start the warm starter now (its imports then overlap whatever the caller does first: the
        preflight and pinning of `retrain run`), and end it when this block ends."""
        warm = self._launcher if isinstance(self._launcher, WarmLauncher) else None
        pipeline = pipeline or load_pipeline_spec(self.options.pipeline_file)
        if warm is None or self._kept_warm:
            yield
            return
        # A pipeline none of whose steps a starter could fork gets none now: it would import torch and
        # MLflow for nothing. (A `python -m` preflight starts one when it comes, as a first warm start does.)
        if any(
            starts_as_module(step.component.command, step.distribution) for step in pipeline.steps.values()
        ):
            warm.warm_up(self._steps_code_folder(pipeline), self.environ)
        self._kept_warm = True
        try:
            yield
        finally:
            self._kept_warm = False
            warm.close()

    def _run(self, pipeline: PipelineSpec, request: RunRequest, force_rerun: bool) -> RunRecord:
        task_code = None
        if TASK_INPUT in pipeline.inputs:  # a pipeline that carries a task: check it before any step
            request, task_code = _pinned_task_code(request, self.task_search_path(pipeline))
            # The pinned raw data is read only if a per-class metric (recall_7) needs its class count.
            pinned = Path(request.data.uri)
            self.preflight(pipeline).check(request, raw=pinned if pinned.is_dir() else None)
        values = pipeline_values(pipeline, request)
        sweep_staging(self.cache.root, self.runs)  # what killed runs left; never a live run's
        record = self._new_record(pipeline, request, force_rerun)
        executor = StepExecutor(
            self._launcher, self.clock, self.options.max_preemption_restarts, self._on_process_started
        )
        context = RunContext(self.options, self.environ, self.clock, self.runs, self.cache, self.say)
        run = PipelineExecution(
            context, pipeline, request, values, record, executor, force_rerun,
            task_code=task_code, task_search_path=self.task_search_path(pipeline),
        )  # fmt: skip
        with self._durable_folders_held(pipeline, request, record.run_id, force_rerun):
            self.runs.create(record)
            with _forwarding_stop_signals(executor):
                return run.execute()

    @contextmanager
    def _durable_folders_held(
        self, pipeline: PipelineSpec, request: RunRequest, run_id: str, forced: bool
    ) -> Iterator[None]:
        """Hold the lock of every durable folder the run writes (train's checkpoints), waiting for a run
        that holds one. Taken in a fixed order, so two runs never hold one each while waiting for the other.
        The record is created only once they are held: a run stopped while waiting leaves nothing behind."""
        folders = sorted(
            durable_path(self.options.state_root, pipeline, step, output, request, run_id if forced else None)
            for step in pipeline.steps.values()
            for output in durable_outputs(step)
        )
        holder = f"run {run_id} (pid {os.getpid()})"
        with ExitStack() as held:
            for folder in folders:
                lock = self.options.state_root / LOCKS_FOLDER / folder.parent.name / f"{folder.name}.lock"
                lock.parent.mkdir(parents=True, exist_ok=True)

                def waiting(other: str, folder: Path = folder) -> None:
                    self.say(
                        "run",
                        f"waiting for {other or 'another run'} to end: it trains into {folder} too; "
                        "this run starts once it has ended",
                    )

                held.enter_context(exclusive_file_lock(lock, holder, waiting))
            yield

    def preflight(self, pipeline: PipelineSpec) -> Preflight:
        """The given preflight, else the check run by this runner's interpreter in the steps' code folder."""
        if self._preflight is None:
            warm = self._launcher if isinstance(self._launcher, WarmLauncher) else None
            self._preflight = SubprocessPreflight(
                self.options.python, self._steps_code_folder(pipeline), self.environ, runner=warm
            )
        return self._preflight

    def _steps_code_folder(self, pipeline: PipelineSpec) -> Path:
        return self.options.code_root or pipeline.steps[pipeline.order[0]].component.code

    def task_search_path(self, pipeline: PipelineSpec) -> list[str]:
        """Where the steps look for a module task, as their sys.path begins: the code folder they run in
        (`python -m` puts it first), the PYTHONPATH they get, then what this interpreter has (the steps
        run it too, by default), its working folder left out, since theirs is the code folder."""
        extra = [entry for entry in self.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
        return [str(self._steps_code_folder(pipeline)), *extra, *(entry for entry in sys.path if entry)]

    def _new_record(self, pipeline: PipelineSpec, request: RunRequest, force_rerun: bool) -> RunRecord:
        created_at = self.clock.now()
        return RunRecord(
            run_id=new_run_id(created_at),
            job_name=request.job_name(),
            run_key=request.run_key,
            model_name=request.model_name,
            data_version=request.data.version,
            data_uri=request.data.uri,
            created_at=created_at,
            steps=tuple(
                StepRecord(
                    name=name, component=pipeline.steps[name].component.reference.removeprefix("azureml:")
                )
                for name in pipeline.order
            ),
            parameters={name: format_value(value) for name, value in request.parameters.items()},
            process_count=request.process_count,
            forced=force_rerun,
            runner=ProcessIdentity.current(),  # the run is abandoned once this process has ended
        )

    def say(self, step: str, message: str) -> None:
        self._progress.write(f"{step:<{_NAME_WIDTH}} {message}\n")
        self._progress.flush()


def _pinned_task_code(request: RunRequest, search_path: list[str]) -> tuple[RunRequest, TaskCode | None]:
    """The task's code as the run starts, and the request with its hash: a task file must still be what the
    request pinned; a module task's source files are pinned here (its hash keys the steps' cache entries
    and checkpoints, and every step checks the code is still that)."""
    reference = parse_task_reference(request.task, None, "task")
    code = task_code(reference, search_path)
    if code is None:
        return request, None  # a built-in's code is the snapshot's; a missing module, the preflight's to say
    if request.task_sha256 is None:
        return replace(request, task_sha256=code.sha256), code
    if code.sha256 != request.task_sha256:
        what = f"task file {reference.path}" if reference.path is not None else code.what
        raise SubmissionError(
            f"{what}: changed since the run was requested (sha256 {str(request.task_sha256)[:12]}...); "
            "request the run again"
        )
    return request, code


def _check_component_versions(pipeline: PipelineSpec, request: RunRequest) -> None:
    for name, version in request.component_versions.items():
        if name not in pipeline.steps:
            raise SubmissionError(
                f"component version for step '{name}': {pipeline.path} has no such step; "
                f"expected one of {list(pipeline.order)}"
            )
        component = pipeline.steps[name].component
        if str(version) != component.version:
            raise SubmissionError(
                f"step '{name}': the request pins {component.name} version {version}, but {component.path} "
                f"is version {component.version}; local runs use the YAMLs of this checkout"
            )


@contextmanager
def _forwarding_stop_signals(executor: StepExecutor) -> Iterator[None]:
    """SIGTERM/SIGINT to the runner reach the running step (which saves, as on eviction) and stop the run.
    Python allows signal handlers in the main thread only; elsewhere the caller's handling stands."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, _frame: object) -> None:
        executor.request_stop(signum)

    previous = {signum: signal.signal(signum, forward) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
