"""One pipeline run in progress: each step reused from the cache or executed, and the record kept current.

A step is reused, as Azure ML reuses one, when everything that decides its outputs is unchanged: the
component version, the code snapshot (fingerprint.py), the environment spec, the command line template,
its parameter values, the content of each input (an upstream output by the hash recorded with it; prep's
previous prepared data version, which decides its schema, by its files), the process count, and for a
user's task its code: a task file's content (on Azure ML it is part of the code snapshot; here it is read
where it is), or a module task's package sources. Together they make the step's
cache key (cache.py). So that a key never names code or data other than what ran, the code snapshot and the
task's code are hashed again as each step starts and once it has ended, and its inputs are hashed as it
starts (a pinned raw version also against its manifest, an upstream output against the hash it was
published with) and again once it has ended: a change fails the run in one line naming the file, and the
step's outputs are discarded, never cached. An entry whose outputs changed since they were published is set
aside and its step run again (cache.py). An
output the pipeline gives a fixed path (train's `checkpoints`) is not cached: it lives at
`<state>/<output>/<checkpoint key>/` (components/checkpoint_key.py: the run key and the options that decide
the training), so a rerun of the same training resumes from it, one with other epochs never does, and
neither its path nor its content is part of any key.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from components.data_version import check_pinned
from components.errors import PipelineError, StepFailed, SubmissionError
from components.fingerprint import (
    code_listing,
    content_listing,
    environment_hash,
    first_difference,
    listing_hash,
)
from components.local.cache import CacheEntry, StepCache, cache_key
from components.local.clock import Clock
from components.local.commands import format_value
from components.local.credentials import credentials_apart
from components.local.launch import (
    PREEMPTED_EXIT_CODE,
    StepExecutor,
    StepLaunch,
    TorchrunReports,
    reported_reason,
    step_environment,
)
from components.local.options import RunnerOptions
from components.local.plan import (
    durable_outputs,
    durable_path,
    process_count,
    step_argv,
    step_input_values,
    step_parameters,
)
from components.local.resumes import resume_lines, warning_lines
from components.local.runs import RunRecord, RunStore, StepAttempt, StepRecord
from components.request import CANCELED, COMPLETED, FAILED, RUNNING, RunRequest
from components.run_inputs import TASK_INPUT
from components.specs import PipelineSpec, StepOutput, StepSpec
from components.task_ref import TaskCode, parse_task_reference, task_code
from core.secrets import mask_secrets


class _Stopped(Exception):
    """The runner was asked to stop (SIGTERM/SIGINT) while a step ran; the step was told and has ended."""


class LocalStepFailed(StepFailed):
    """A step exited non-zero. The first line names the step, its exit code and its log; the lines after
    it are the log's tail."""

    def __init__(
        self, run_id: str, step: str, exit_code: int, log_file: Path, log_tail: list[str], note: str = ""
    ) -> None:
        how = (
            f"was killed by {signal.Signals(-exit_code).name}"
            if exit_code < 0 and -exit_code in signal.valid_signals()
            else f"failed with exit code {exit_code}"
        )
        # Not `exit_code`: that is the command line's own (2, as for every PipelineError).
        self.run_id, self.step, self.step_exit_code = run_id, step, exit_code
        self.log_file, self.log_tail = log_file, log_tail
        self.headline = f"step '{step}' {how}{note}; its log: {log_file}"
        super().__init__("\n".join([self.headline, *(f"  | {line}" for line in log_tail)]))


class StepUntrue(PipelineError):
    """What a step ran on is not what its cache key names: its code changed during the run, or it (or
    something else) changed one of its inputs. The run fails; the step's outputs are never cached."""

    def __init__(self, step: str, message: str) -> None:
        self.step = step
        super().__init__(message)


def log_tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return text.splitlines()[-lines:]


@dataclass(frozen=True)
class _Produced:
    """An executed or reused step's outputs, by path, and the content hash of each cached one."""

    paths: Mapping[str, Path]
    hashes: Mapping[str, str]


@dataclass(frozen=True)
class RunContext:
    """What one run's execution needs of the runner that starts it: its options and environment, its clock,
    where run records and cache entries go, and where a step's progress is said. Given, not reached for:
    the execution never imports the runner."""

    options: RunnerOptions
    environ: Mapping[str, str]
    clock: Clock
    runs: RunStore
    cache: StepCache
    say: Callable[[str, str], None]


class PipelineExecution:
    """One run's mutable progress: its record, the outputs produced so far, and the hashes computed."""

    def __init__(
        self,
        context: RunContext,
        pipeline: PipelineSpec,
        request: RunRequest,
        values: Mapping[str, Any],
        record: RunRecord,
        executor: StepExecutor,
        force_rerun: bool,
        task_code: TaskCode | None = None,
        task_search_path: Sequence[str] = (),
    ) -> None:
        self.context, self.pipeline, self.request, self.values = context, pipeline, request, values
        self.record, self.executor, self.force_rerun = record, executor, force_rerun
        self._forced_run = record.run_id if force_rerun else None
        self.options = context.options
        self.produced: dict[str, _Produced] = {}
        # The code as the run started: each code folder's files and the task's, which every step must see.
        self._code_listings: dict[Path, dict[str, str]] = {}
        self._task_code, self._task_search_path = task_code, tuple(task_search_path)
        self._environment_hash: str | None = None

    def execute(self) -> RunRecord:
        try:
            for name in self.pipeline.order:
                if self.executor.stop_signal is not None:
                    break
                self.produced[name] = self._step(self.pipeline.steps[name])
        except _Stopped:
            return self._stopped()
        except LocalStepFailed as failure:
            self._finish(FAILED, failed_step=failure.step, error=failure.headline)
            raise
        except StepUntrue as failure:
            self.context.say(failure.step, str(failure))
            self._finish(FAILED, failed_step=failure.step, error=str(failure))
            raise
        except BaseException as error:
            self._finish(FAILED, error=str(error).splitlines()[0] if str(error) else type(error).__name__)
            raise
        if self.executor.stop_signal is not None:
            return self._stopped()
        return self._finish(COMPLETED)

    def _stopped(self) -> RunRecord:
        signum = self.executor.stop_signal
        name = signal.Signals(signum).name if signum is not None else "a stop request"
        self.context.say("run", f"stopped by {name}; run the same command again to continue")
        return self._finish(CANCELED)

    def _finish(self, status: str, failed_step: str | None = None, error: str | None = None) -> RunRecord:
        steps = tuple(
            replace(step, status=CANCELED) if step.status not in (COMPLETED, FAILED) else step
            for step in self.record.steps
        )
        self._save(
            replace(
                self.record,
                steps=steps,
                status=status,
                finished_at=self.context.clock.now(),
                failed_step=failed_step,
                error=error,
                outputs=self._parent_outputs() if status == COMPLETED else {},
            )
        )
        return self.record

    def _parent_outputs(self) -> dict[str, str]:
        return {
            setting.parent_output: str(self.produced[step.name].paths[output])
            for step in self.pipeline.steps.values()
            for output, setting in step.outputs.items()
            if setting.parent_output
        }

    def _save(self, record: RunRecord) -> None:
        self.record = record
        self.context.runs.save(record)

    def _update_step(self, name: str, **changes: Any) -> StepRecord:
        updated = replace(self.record.step(name), **changes)
        self._save(self.record.with_step(updated))
        return updated

    # -- one step ---------------------------------------------------------------------------------------

    def _step(self, step: StepSpec) -> _Produced:
        upstream_paths = {
            (producer, output): path
            for producer, produced in self.produced.items()
            for output, path in produced.paths.items()
        }
        inputs = step_input_values(step, self.values, step_parameters(self.request), upstream_paths)
        nproc = process_count(step, self.request)
        cached_outputs = sorted(set(step.component.outputs) - durable_outputs(step))
        self._check_code(step)
        listings = self._input_listings(step, inputs)
        material = {
            "step": step.name,
            "component": step.component.reference,
            "code": listing_hash(self._code_listings[self._code_folder(step)]),
            "environment": self._environment(),
            "command": step.component.command,
            "inputs": {
                name: self._input_fingerprint(step, name, value, listings) for name, value in inputs.items()
            },
            "process_count": nproc,
            "outputs": cached_outputs,
        }
        if TASK_INPUT in step.component.inputs and self.request.task_sha256 is not None:
            # A user's task lives outside the code snapshot: its code's hash joins the key itself.
            is_file = parse_task_reference(self.request.task, None, "task").is_file
            material["task_file_sha256" if is_file else "task_code_sha256"] = self.request.task_sha256
        key = cache_key(material)
        entry = None if self.force_rerun else self._true_entry(step, key)
        if entry is not None:
            return self._reuse(step, entry, cached_outputs)
        return self._run(step, inputs, nproc, key, material, cached_outputs, listings)

    def _true_entry(self, step: StepSpec, key: str) -> CacheEntry | None:
        """The entry of `key`, if its outputs are still what was published; a changed one is set aside."""
        cache = self.context.cache
        entry = cache.lookup(step.name, key)
        change = cache.changed_output(entry) if entry is not None else None
        if entry is None or change is None:
            return entry
        aside = cache.set_aside(entry)
        self.context.say(
            step.name, f"cache entry {entry.path}: {change}; moved aside to {aside}, running the step again"
        )
        return None

    def _code_folder(self, step: StepSpec) -> Path:
        return self.options.code_root or step.component.code

    def _check_code(self, step: StepSpec) -> None:
        """The code `step` runs is the code the run started with: its code folder's files, and the task's."""
        folder = self._code_folder(step)
        listing = code_listing(folder)
        started = self._code_listings.setdefault(folder, listing)
        change = first_difference(started, listing)
        if change is not None:
            raise StepUntrue(
                step.name,
                f"code file {folder}/{change.replace(' before, ', ' when the run started, ')}: changed "
                "during the run; the run's results are discarded, run it again",
            )
        if self._task_code is None or TASK_INPUT not in step.component.inputs:
            return
        reference = parse_task_reference(self.request.task, None, "task")
        task_change = self._task_code.change(task_code(reference, self._task_search_path))
        if task_change is not None:
            raise StepUntrue(step.name, f"{task_change}; the run's results are discarded, run it again")

    def _environment(self) -> str:
        if self._environment_hash is None:
            self._environment_hash = environment_hash(self.options.environment_file)
        return self._environment_hash

    def _input_listings(self, step: StepSpec, inputs: Mapping[str, Any]) -> dict[str, dict[str, str]]:
        """Each path input's files with their sha256, as the step starts: a pinned raw version checked
        against its manifest, an upstream output against the hash it was made with."""
        listings: dict[str, dict[str, str]] = {}
        for name, value in inputs.items():
            if value is None or not step.component.inputs[name].is_path:
                continue
            path = Path(str(value))
            if not path.exists():
                raise SubmissionError(
                    f"step '{step.name}': input '{name}' is {value!r}, which is not a local file or folder; "
                    "local runs read local data (`retrain run --data FOLDER` snapshots one)"
                )
            binding = step.inputs.get(name)
            if not isinstance(binding, StepOutput):
                check_pinned(path)
            listings[name] = content_listing(path)
            made = self._made_hash(binding)
            if made is not None and listing_hash(listings[name]) != made:
                raise StepUntrue(
                    step.name,
                    f"step '{step.name}': input '{name}' ({path}) changed since step '{binding.step}' "
                    f"made it (sha256 {made.removeprefix('sha256:')[:12]}... then); the run's results are "
                    "discarded, run it again",
                )
        return listings

    def _made_hash(self, binding: Any) -> str | None:
        if isinstance(binding, StepOutput):
            return self.produced[binding.step].hashes.get(binding.output)
        return None

    def _input_fingerprint(
        self, step: StepSpec, name: str, value: Any, listings: Mapping[str, Mapping[str, str]]
    ) -> str | None:
        if value is None:
            return None
        if name not in listings:
            # Masked: a credential decides no output, and the key must not be a hash of one.
            return mask_secrets(format_value(value))
        return listing_hash(listings[name])  # an upstream output's equals the hash it was made with

    def _check_inputs_kept(self, step: StepSpec, inputs: Mapping[str, Any], listings: Mapping) -> None:
        """After the step: each path input still holds what it held as the step started. A step that wrote
        into one (its pinned raw data, an upstream output) made its outputs from something no key names."""
        for name, before in listings.items():
            change = first_difference(before, content_listing(Path(str(inputs[name]))))
            if change is not None:
                raise StepUntrue(
                    step.name,
                    f"step '{step.name}' changed its input '{name}' ({inputs[name]}): "
                    f"{change.replace(' before, ', ' as the step started, ')}; its outputs are discarded",
                )

    def _output_paths(self, step: StepSpec, folder: Path, cached_outputs: list[str]) -> dict[str, Path]:
        paths = {name: folder / name for name in cached_outputs}
        paths.update(
            {
                name: durable_path(
                    self.options.state_root, self.pipeline, step, name, self.request, self._forced_run
                )
                for name in durable_outputs(step)
            }
        )
        return paths

    def _reuse(self, step: StepSpec, entry: CacheEntry, cached_outputs: list[str]) -> _Produced:
        paths = self._output_paths(step, entry.path, cached_outputs)
        self._update_step(
            step.name,
            status=COMPLETED,
            reused=True,
            cache_key=entry.key,
            started_at=self.context.clock.now(),
            duration_s=0.0,
            outputs={name: str(path) for name, path in paths.items()},
        )
        self.context.say(step.name, f"reused (cache entry {entry.key[:12]}, made by run {entry.run_id})")
        return _Produced(paths, entry.output_hashes)

    def _run(
        self,
        step: StepSpec,
        inputs: Mapping[str, Any],
        nproc: int,
        key: str,
        material: Mapping[str, Any],
        cached_outputs: list[str],
        listings: Mapping[str, Mapping[str, str]],
    ) -> _Produced:
        cache, clock = self.context.cache, self.context.clock
        step_folder = self.context.runs.step_dir(self.record.run_id, step.name)
        step_folder.mkdir(parents=True)
        staging = cache.stage(step.name, self.record.run_id)
        try:
            paths = self._output_paths(step, staging, cached_outputs)
            self._create_output_folders(step, paths)
            launch = self._launch(step, inputs, paths, nproc, step_folder)
            started = clock.monotonic()
            self._update_step(
                step.name, status=RUNNING, cache_key=key, started_at=clock.now(), command=launch.argv,
                log=str(launch.log_file),
            )  # fmt: skip
            self.context.say(
                step.name, f"started ({self.record.step(step.name).component}, log {launch.log_file})"
            )
            attempt = self.executor.execute(
                launch, self._recorder(step.name), lambda text: self.context.say(step.name, text)
            )
            duration = round(clock.monotonic() - started, 3)
            if attempt is None or attempt.exit_code != 0:
                raise self._failure(step, attempt, launch, duration)
            try:  # what ran is what the key names: the same code, inputs the step left as they were
                self._check_code(step)
                self._check_inputs_kept(step, inputs, listings)
            except StepUntrue:
                self._update_step(step.name, status=FAILED, duration_s=duration)
                raise
            hashes = {name: listing_hash(content_listing(paths[name])) for name in cached_outputs}
            final = self._publish(step, staging, key, material, hashes, step_folder)
        except BaseException:
            cache.discard(staging)  # gone already once published: a failure leaves no half entry
            raise
        paths = self._output_paths(step, final, cached_outputs)
        self._update_step(
            step.name,
            status=COMPLETED,
            duration_s=duration,
            outputs={name: str(path) for name, path in paths.items()},
        )
        self.context.say(step.name, f"completed in {duration:.1f} s")
        for name in cached_outputs:  # a training's resumes, this run's and earlier runs' of it
            for line in resume_lines(paths[name]) + warning_lines(paths[name]):
                self.context.say(step.name, line)
        return _Produced(paths, hashes)

    def _create_output_folders(self, step: StepSpec, paths: Mapping[str, Path]) -> None:
        # Azure ML mounts every output as an existing, empty folder (uri_file outputs excepted).
        for name, path in paths.items():
            if step.component.outputs[name].type != "uri_file":
                path.mkdir(parents=True, exist_ok=True)

    def _launch(
        self, step: StepSpec, inputs: Mapping[str, Any], paths: Mapping[str, Path], nproc: int, folder: Path
    ) -> StepLaunch:
        python = self.options.python
        reports = TorchrunReports.in_folder(folder) if step.distribution is not None else None
        inputs, credentials = credentials_apart(inputs, self.request.task_options, self.context.environ)
        return StepLaunch(
            step=step.name,
            argv=tuple(step_argv(step, inputs, paths, nproc, python, reports)),
            cwd=self._code_folder(step),
            env={
                **step_environment(
                    self.context.environ,
                    self.options.state_root,
                    python,
                    reports,
                    self.record.run_id,
                    warm_start=self.options.warm_start,
                ),
                **credentials,
            },
            folder=folder,
            reports=reports,
        )

    def _recorder(self, name: str) -> Callable[[StepAttempt], None]:
        def record_attempt(attempt: StepAttempt) -> None:
            self._update_step(name, attempts=(*self.record.step(name).attempts, attempt))

        return record_attempt

    def _failure(
        self, step: StepSpec, attempt: StepAttempt | None, launch: StepLaunch, duration: float
    ) -> Exception:
        if attempt is None or self.executor.stop_signal is not None:
            self._update_step(step.name, status=CANCELED, duration_s=duration)
            self.context.say(
                step.name, f"stopped after {duration:.1f} s, as asked; its outputs are discarded"
            )
            return _Stopped(step.name)
        exit_code = attempt.exit_code
        note = ""
        if exit_code == PREEMPTED_EXIT_CODE:
            note = (
                f" (preempted {len(self.record.step(step.name).attempts)} times; the cap is "
                f"{self.options.max_preemption_restarts} restarts)"
            )
        elif reported_reason(launch.reports, exit_code):
            # The failed worker's own line from torchrun's error file: "training diverged at step N: ...",
            # "task 'x': loss() returned ...", never torchrun's ChildFailedError.
            note = f" ({reported_reason(launch.reports, exit_code)})"
        self._update_step(step.name, status=FAILED, duration_s=duration)
        failure = LocalStepFailed(
            self.record.run_id,
            step.name,
            exit_code,
            launch.log_file,
            log_tail(launch.log_file, self.options.log_tail_lines),
            note,
        )
        self.context.say(step.name, f"failed after {duration:.1f} s: {failure.headline}")
        return failure

    def _publish(
        self, step: StepSpec, staging: Path, key: str, material: Mapping[str, Any], hashes: Mapping[str, str],
        step_folder: Path,
    ) -> Path:  # fmt: skip
        entry = CacheEntry(
            step=step.name, key=key, path=staging, output_hashes=hashes, run_id=self.record.run_id,
            created_at=self.context.clock.now(), material=material,
        )  # fmt: skip
        published = self.context.cache.publish(staging, entry)
        if published is not None:
            return published.path
        kept = step_folder / "outputs"
        staging.rename(kept)
        return kept
