"""What each step of a run receives: pipeline input values, step input values, and its command line.

Values come, from strongest to weakest: the run request (its data, model name and trigger, which the
Azure ML builder sets the same way), the request's `parameters`, the pipeline.yml inputs' defaults, the
component inputs' defaults. A parameter names a pipeline input (`epochs`) or a component input that the
pipeline leaves unbound (`checkpoint_every_steps`; Azure ML pipelines have no optional inputs), exactly as
the Azure ML builder accepts them; an input that reads another step's output cannot be overridden.

The same functions serve the runner and the benchmark's direct baseline, so both run identical commands.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.builder import REGISTRY_LOCK_INPUT, check_registry_lock
from components.checkpoint_key import checkpoint_key
from components.errors import SpecError, SubmissionError
from components.local.commands import render_command
from components.local.launch import TorchrunReports, launch_argv
from components.request import RunRequest
from components.run_inputs import (
    DATA_INPUT,
    PREVIOUS_PREPARED_INPUT,
    RESERVED_INPUTS,
    reserved_values,
)
from components.specs import ParentInput, PipelineSpec, Port, StepOutput, StepSpec
from core.gate_rules import GATE_RULES
from core.secrets import mask_secrets
from core.text import quoted
from core.train_rules import TRAIN_RULES

REGISTRY_LOCK_EXPECTED = (
    "a folder, or a blob container URL without credentials (no user info or SAS query; the lock uses the "
    "managed identity, or the emulator's connection string), such as "
    "https://<account>.blob.core.windows.net/<container>/<prefix>"
)
# The tabular model's sizes were train inputs before tasks existed; a parameter naming one gets a hint.
TASK_MODEL_OPTIONS = ("hidden_width", "hidden_layers", "dropout")


def _overridable_inputs(pipeline: PipelineSpec) -> set[str]:
    names = set(pipeline.inputs)
    for step in pipeline.steps.values():
        names |= {
            name
            for name in step.component.inputs
            if not isinstance(step.inputs.get(name), ParentInput | StepOutput)
        }
    return names - set(RESERVED_INPUTS)


def check_parameters(pipeline: PipelineSpec, parameters: Mapping[str, Any]) -> None:
    for name in parameters:
        if name in RESERVED_INPUTS:
            raise SubmissionError(
                f"parameter {name}: set by the run itself (--data, --model-name, the trigger, --task and "
                "--task-option, the model's configuration file, or the front door's last good prepared "
                "data version); remove it"
            )
    unknown = sorted(set(parameters) - _overridable_inputs(pipeline))
    moved = [name for name in unknown if name in TASK_MODEL_OPTIONS]
    if moved:
        raise SubmissionError(
            f"parameter {moved[0]}: an option of the tabular task now, not a pipeline input; pass "
            f"--task-option {moved[0]}=VALUE or set it under [task.options] in the model's configuration"
        )
    if unknown:
        raise SubmissionError(
            f"parameters {unknown}: not inputs of the pipeline; expected some of "
            f"{sorted(_overridable_inputs(pipeline))}"
        )


def parameter_ports(pipeline: PipelineSpec) -> dict[str, Port]:
    """Each settable parameter's input port: a pipeline input's is the step input it feeds (the first
    step's, in the pipeline's order), else the component input's own (an input no step binds)."""
    ports: dict[str, Port] = {}
    for step in pipeline.steps.values():
        for name, port in step.component.inputs.items():
            binding = step.inputs.get(name)
            if isinstance(binding, ParentInput):
                ports.setdefault(binding.name, port)
            elif name not in step.inputs:
                ports.setdefault(name, port)
    return ports


_TYPE_FORMS = {
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
}
_WHOLE = re.compile(r"[+-]?[0-9]+")


def expected_form(port: Port) -> str:
    """What `port` accepts, for an error message: 'a whole number >= 1', 'a finite number from 0 to 1',
    'one of ddp, fsdp'."""
    if port.choices is not None:
        return f"one of {', '.join(port.choices)}"
    form = _TYPE_FORMS.get(port.type, "text (or a number)")
    low, high = port.minimum, port.maximum
    if low is not None and high is not None:
        return f"{form} from {low:g} to {high:g}"
    if low is not None:
        return f"{form} >= {low:g}"
    if high is not None:
        return f"{form} <= {high:g}"
    return form


def value_fits(value: Any, port: Port) -> bool:
    """Whether a typed value (TOML's, a request's) suits `port`'s type, bounds and choices."""
    if isinstance(value, bool):
        return port.type == "boolean"
    if port.choices is not None:
        return isinstance(value, str) and value in port.choices
    if port.type == "integer":
        fits = isinstance(value, int)
    elif port.type == "number":
        fits = isinstance(value, int | float) and math.isfinite(value)
    elif port.type == "boolean":
        return False
    else:
        return isinstance(value, str | int | float)  # text, and paths for a folder input
    return (
        fits
        and (port.minimum is None or value >= port.minimum)
        and (port.maximum is None or value <= port.maximum)
    )


def parse_text_value(text: str, port: Port) -> Any:
    """A value given as text (an app setting, `--param`) read by `port`'s type; ValueError if it cannot be
    (the bounds are `value_fits`'s to check)."""
    if port.type == "integer":
        if not _WHOLE.fullmatch(text.strip()):
            raise ValueError(text)
        return int(text)
    if port.type == "number":
        return float(text)  # 'nan' and 'inf' parse; value_fits refuses them
    if port.type == "boolean":
        lowered = text.strip().lower()
        if lowered not in ("true", "false"):
            raise ValueError(text)
        return lowered == "true"
    return text


def parameter_refusal(name: str, value: Any, port: Port) -> str | None:
    """The form `name` expects when `value` (typed, or text as `parse_text_value` reads it) does not suit
    its port or, for a trainer's or the gate's parameter, its own rule (core/train_rules.py and
    core/gate_rules.py, which the trainer and the gate check by too: a learning rate of 0 passes the port's
    inclusive `min: 0`, not the trainer; a confidence of 1 passes `max: 1`, not the gate); None when it
    does."""
    rule = TRAIN_RULES.get(name) or GATE_RULES.get(name)
    if not value_fits(value, port) or (rule is not None and not rule.fits(value)):
        return rule.expected if rule is not None else expected_form(port)
    if name == REGISTRY_LOCK_INPUT:
        try:  # the register step opens it only after a whole training
            check_registry_lock(str(value), name, folder=True)
        except SubmissionError:
            return REGISTRY_LOCK_EXPECTED
    return None


def check_parameter_texts(pipeline: PipelineSpec, parameters: Mapping[str, str]) -> None:
    """Parameters given as text (RETRAIN_PIPELINE_PARAMETERS): each names an input (`check_parameters`)
    and its text reads as a value of that input's type, within its bounds. Raises one-line errors."""
    check_parameters(pipeline, parameters)
    ports = parameter_ports(pipeline)
    for name, text in parameters.items():
        port = ports.get(name)
        if port is None:
            continue  # a pipeline input no step reads: nothing says what it must be
        try:
            value = parse_text_value(text, port)
        except ValueError:
            value = text  # text fits no typed port: refused below, in the port's form
        refusal = parameter_refusal(name, value, port)
        if refusal is not None:
            raise SubmissionError(f"parameter {name} is {quoted(mask_secrets(text), 60)}; expected {refusal}")


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
