"""What each step of a run receives: pipeline input values, step input values, and its command line.

Values come, from strongest to weakest: the run request (its data, model name and trigger, which the
Azure ML builder sets the same way), the request's `parameters`, the pipeline.yml inputs' defaults, the
component inputs' defaults. Which parameters a run may set, and what each accepts, is
components/parameters.py's to say, for every runner alike.

The same functions serve the runner and the benchmark's direct baseline, so both run identical commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.checkpoint_key import checkpoint_key
from components.errors import SpecError, SubmissionError
from components.local.commands import render_command
from components.local.launch import TorchrunReports, launch_argv
from components.parameters import check_parameters
from components.request import RunRequest
from components.run_inputs import DATA_INPUT, PREVIOUS_PREPARED_INPUT, reserved_values
from components.specs import ParentInput, PipelineSpec, StepOutput, StepSpec


def pipeline_values(pipeline: PipelineSpec, request: RunRequest) -> dict[str, Any]:
    """The pipeline-level input values of this run."""
    check_parameters(pipeline, request.parameters)
    if DATA_INPUT not in pipeline.inputs:
        raise SpecError(f"{pipeline.path}: no '{DATA_INPUT}' input; the run's data is bound to it")
    values = dict(pipeline.inputs)
    values[DATA_INPUT] = request.data.uri
    # The same values an Azure ML job gets (components/run_inputs.py).
    reserved = reserved_values(
        request.model_name, request.data.version, request.trigger, request.task, request.task_options_text
    )
    values.update({name: value for name, value in reserved.items() if name in pipeline.inputs})
    values.update({name: value for name, value in request.parameters.items() if name in pipeline.inputs})
    return values


def step_parameters(request: RunRequest) -> dict[str, Any]:
    """What a step's inputs that no step binds take: the request's parameters, and what the run sets on a
    step itself (prep's `previous_prepared`, the request's previous prepared data version), as the Azure ML
    builder sets them on the step."""
    values = dict(request.parameters)
    if request.previous_prepared is not None:
        values[PREVIOUS_PREPARED_INPUT] = request.previous_prepared
    return values


def step_input_values(
    step: StepSpec,
    pipeline_inputs: Mapping[str, Any],
    parameters: Mapping[str, Any],
    upstream_outputs: Mapping[tuple[str, str], Path],
) -> dict[str, Any]:
    """Each declared input of `step` and its value (None: unset). Upstream outputs are given by path."""
    values: dict[str, Any] = {}
    for name, port in step.component.inputs.items():
        binding = step.inputs.get(name)
        if isinstance(binding, StepOutput):
            values[name] = upstream_outputs[(binding.step, binding.output)]
        elif isinstance(binding, ParentInput):
            if binding.name not in pipeline_inputs:
                raise SpecError(
                    f"step '{step.name}': input '{name}' reads pipeline input '{binding.name}', "
                    "which pipeline.yml does not declare"
                )
            values[name] = pipeline_inputs[binding.name]
        elif name in parameters:
            values[name] = parameters[name]
        else:
            values[name] = binding if binding is not None else port.default
        if values[name] is None and not port.optional:
            raise SubmissionError(
                f"step '{step.name}': input '{name}' is required but unset; pass --param {name}=VALUE or "
                "give it a default in the component YAML"
            )
    return values


def durable_outputs(step: StepSpec) -> frozenset[str]:
    """Outputs the pipeline gives a fixed path (train's checkpoints): one per checkpoint key, never cached."""
    return frozenset(name for name, setting in step.outputs.items() if setting.path)


def durable_path(
    state_root: Path,
    pipeline: PipelineSpec,
    step: StepSpec,
    output: str,
    request: RunRequest,
    forced_run: str | None = None,
) -> Path:
    """Where a durable output lives: `<state>/<output>/<checkpoint key>/`, one folder per training of a run
    key (components/checkpoint_key.py), which every rerun of that training resumes from. A forced run
    (`--force-rerun`: every step runs again) has a folder of its own, `<checkpoint key>-forced-<run id>`,
    so that it trains from scratch and leaves the key's checkpoints as they were."""
    key = checkpoint_key(pipeline, step.name, request)
    return state_root / output / (key if forced_run is None else f"{key}-forced-{forced_run}")


def process_count(step: StepSpec, request: RunRequest) -> int:
    return request.process_count if step.distribution is not None else 1


def step_argv(
    step: StepSpec,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Path],
    nproc: int,
    python: str,
    reports: TorchrunReports | None = None,
) -> list[str]:
    """The command line of `step`, as the process will be started: `python` is `python`, and a
    `distribution: pytorch` step runs under torchrun with `nproc` processes."""
    argv = render_command(step.component.command, inputs, outputs, step.name)
    return launch_argv(argv, step.distribution, nproc, python, step.name, reports)
