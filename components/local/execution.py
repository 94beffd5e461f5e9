"""One pipeline run in progress: each step reused from the cache or executed, and the record kept current.

A step is reused, as Azure ML reuses one, when everything that decides its outputs is unchanged: the
component version, the code snapshot (fingerprint.py), the environment spec, the command line template,
its parameter values, the content of each input (an upstream output by the hash recorded with it), the
process count, and for a task that is a user's file, that file's content (on Azure ML it is part of the
code snapshot; here it is read where it is). Together they make the step's cache key (cache.py). An
output the pipeline gives a fixed path (train's `checkpoints`) is not cached: it lives at
`<state>/<output>/<checkpoint key>/` (components/checkpoint_key.py: the run key and the options that decide
the training), so a rerun of the same training resumes from it, one with other epochs never does, and
neither its path nor its content is part of any key.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.errors import StepFailed, SubmissionError
from components.local.cache import CacheEntry, cache_key
from components.local.commands import format_value
from components.local.credentials import credentials_apart
from components.local.fingerprint import code_hash, content_hash, environment_hash
from components.local.launch import (
    DIVERGED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    StepExecutor,
    StepLaunch,
    TorchrunReports,
    reported_reason,
    step_environment,
)
from components.local.plan import (
    durable_outputs,
    durable_path,
    process_count,
    step_argv,
    step_input_values,
)
from components.local.runs import RunRecord, StepAttempt, StepRecord
from components.request import CANCELED, COMPLETED, FAILED, RUNNING, RunRequest
from components.run_inputs import TASK_INPUT
from components.specs import PipelineSpec, StepOutput, StepSpec
from training.common import mask_secrets

if TYPE_CHECKING:
    from components.local.runner import LocalRunner


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
        self.run_id, self.step, self.exit_code = run_id, step, exit_code
        self.log_file, self.log_tail = log_file, log_tail
        self.headline = f"step '{step}' {how}{note}; its log: {log_file}"
        super().__init__("\n".join([self.headline, *(f"  | {line}" for line in log_tail)]))


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


class PipelineExecution:
    """One run's mutable progress: its record, the outputs produced so far, and the hashes computed."""

    def __init__(
        self,
        runner: LocalRunner,
        pipeline: PipelineSpec,
        request: RunRequest,
        values: Mapping[str, Any],
        record: RunRecord,
        executor: StepExecutor,
        force_rerun: bool,
    ) -> None:
        self.runner, self.pipeline, self.request, self.values = runner, pipeline, request, values
        self.record, self.executor, self.force_rerun = record, executor, force_rerun
        self.options = runner.options
        self.produced: dict[str, _Produced] = {}
        self._code_hashes: dict[Path, str] = {}
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
        except BaseException as error:
            self._finish(FAILED, error=str(error).splitlines()[0] if str(error) else type(error).__name__)
            raise
        if self.executor.stop_signal is not None:
            return self._stopped()
        return self._finish(COMPLETED)

    def _stopped(self) -> RunRecord:
        signum = self.executor.stop_signal
        name = signal.Signals(signum).name if signum is not None else "a stop request"
        self.runner.say("run", f"stopped by {name}; run the same command again to continue")
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
                finished_at=self.runner.clock.now(),
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
        self.runner.runs.save(record)

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
        inputs = step_input_values(step, self.values, self.request.parameters, upstream_paths)
        nproc = process_count(step, self.request)
        cached_outputs = sorted(set(step.component.outputs) - durable_outputs(step))
        material = {
            "step": step.name,
            "component": step.component.reference,
            "code": self._code_hash(step),
            "environment": self._environment(),
            "command": step.component.command,
            "inputs": {name: self._input_fingerprint(step, name, value) for name, value in inputs.items()},
            "process_count": nproc,
            "outputs": cached_outputs,
        }
        if TASK_INPUT in step.component.inputs and self.request.task_sha256 is not None:
            # A user's task file lives outside the code snapshot: its content joins the key itself.
            material["task_file_sha256"] = self.request.task_sha256
        key = cache_key(material)
        entry = None if self.force_rerun else self.runner.cache.lookup(step.name, key)
        if entry is not None:
            return self._reuse(step, entry, cached_outputs)
        return self._run(step, inputs, nproc, key, material, cached_outputs)

    def _code_folder(self, step: StepSpec) -> Path:
        return self.options.code_root or step.component.code

    def _code_hash(self, step: StepSpec) -> str:
        folder = self._code_folder(step)
        if folder not in self._code_hashes:
            self._code_hashes[folder] = code_hash(folder)
        return self._code_hashes[folder]

    def _environment(self) -> str:
        if self._environment_hash is None:
            self._environment_hash = environment_hash(self.options.environment_file)
        return self._environment_hash

    def _input_fingerprint(self, step: StepSpec, name: str, value: Any) -> str | None:
        if value is None:
            return None
        if not step.component.inputs[name].is_path:
            # Masked: a credential decides no output, and the key must not be a hash of one.
            return mask_secrets(format_value(value))
        binding = step.inputs.get(name)
        if isinstance(binding, StepOutput) and binding.output in self.produced[binding.step].hashes:
            return self.produced[binding.step].hashes[binding.output]
        path = Path(str(value))
        if not path.exists():
            raise SubmissionError(
                f"step '{step.name}': input '{name}' is {value!r}, which is not a local file or folder; "
                "local runs read local data (`retrain run --data FOLDER` snapshots one)"
            )
        return content_hash(path)

    def _output_paths(self, step: StepSpec, folder: Path, cached_outputs: list[str]) -> dict[str, Path]:
        paths = {name: folder / name for name in cached_outputs}
        paths.update(
            {
                name: durable_path(self.options.state_root, self.pipeline, step, name, self.request)
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
            started_at=self.runner.clock.now(),
            duration_s=0.0,
            outputs={name: str(path) for name, path in paths.items()},
        )
        self.runner.say(step.name, f"reused (cache entry {entry.key[:12]}, made by run {entry.run_id})")
        return _Produced(paths, entry.output_hashes)

    def _run(
        self,
        step: StepSpec,
        inputs: Mapping[str, Any],
        nproc: int,
        key: str,
        material: Mapping[str, Any],
        cached_outputs: list[str],
    ) -> _Produced:
        cache, clock = self.runner.cache, self.runner.clock
        step_folder = self.runner.runs.step_dir(self.record.run_id, step.name)
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
            self.runner.say(
                step.name, f"started ({self.record.step(step.name).component}, log {launch.log_file})"
            )
            attempt = self.executor.execute(
                launch, self._recorder(step.name), lambda text: self.runner.say(step.name, text)
            )
            duration = round(clock.monotonic() - started, 3)
            if attempt is None or attempt.exit_code != 0:
                raise self._failure(step, attempt, launch, duration)
            hashes = {name: content_hash(paths[name]) for name in cached_outputs}
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
        self.runner.say(step.name, f"completed in {duration:.1f} s")
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
        inputs, credentials = credentials_apart(inputs)
        return StepLaunch(
            step=step.name,
            argv=tuple(step_argv(step, inputs, paths, nproc, python, reports)),
            cwd=self._code_folder(step),
            env={
                **step_environment(
                    self.runner.environ, self.options.state_root, python, reports, self.record.run_id
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
            self.runner.say(step.name, f"stopped after {duration:.1f} s, as asked; its outputs are discarded")
            return _Stopped(step.name)
        exit_code = attempt.exit_code
        note = ""
        if exit_code == PREEMPTED_EXIT_CODE:
            note = (
                f" (preempted {len(self.record.step(step.name).attempts)} times; the cap is "
                f"{self.options.max_preemption_restarts} restarts)"
            )
        elif exit_code == DIVERGED_EXIT_CODE and reported_reason(launch.reports, exit_code):
            note = f" ({reported_reason(launch.reports, exit_code)})"  # "training diverged at step N: ..."
        self._update_step(step.name, status=FAILED, duration_s=duration)
        failure = LocalStepFailed(
            self.record.run_id,
            step.name,
            exit_code,
            launch.log_file,
            log_tail(launch.log_file, self.options.log_tail_lines),
            note,
        )
        self.runner.say(step.name, f"failed after {duration:.1f} s: {failure.headline}")
        return failure

    def _publish(
        self, step: StepSpec, staging: Path, key: str, material: Mapping[str, Any], hashes: Mapping[str, str],
        step_folder: Path,
    ) -> Path:  # fmt: skip
        entry = CacheEntry(
            step=step.name, key=key, path=staging, output_hashes=hashes, run_id=self.record.run_id,
            created_at=self.runner.clock.now(), material=material,
        )  # fmt: skip
        published = self.runner.cache.publish(staging, entry)
        if published is not None:
            return published.path
        kept = step_folder / "outputs"
        staging.rename(kept)
        return kept
