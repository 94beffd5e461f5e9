"""A step's checkpoint key: the values a pipeline step receives for the trajectory options.

The run key (model name + data version) names the logical run for the front door: its job name, and with
it exactly-once submission. Two runs of one run key can still train differently, so a step's durable
output, train's checkpoints, lives under a checkpoint key: `<run key>-<digest>`, the digest of the values
the step reads for the options that decide the trajectory (core/trajectory.py: the options, the key), and a
task file's content. Options a resume may change (the checkpoint interval and how many to keep, the mean
time between evictions, the progress display, the process count) are left out, so a rerun with other such
values still resumes. An optional input the run leaves unset (the validation and early-stopping inputs) is
left out of the digest, so runs that do not use them keep the keys they had before those inputs existed.

Values are resolved as the step receives them: the request's parameter, else the pipeline's input, else
the component's default; so `--epochs 5` and pipeline.yml's default of 5 are one key. Locally the key
names `<state>/checkpoints/<key>/`; on Azure ML the datastore path `retrain/checkpoints/<key>/`.
"""

from __future__ import annotations

from typing import Any

from components.request import RunRequest
from components.run_inputs import TASK_INPUT, TASK_OPTIONS_INPUT
from components.specs import ParentInput, PipelineSpec, StepOutput
from core.trajectory import TASK_FILE_DIGEST, TRAJECTORY_FIELDS, checkpoint_key_for


def trajectory_values(pipeline: PipelineSpec, step: str, request: RunRequest) -> dict[str, str]:
    """The trajectory inputs `step` declares, with the values this request gives them, as text (a
    parameter `2` and `"2"` are one value, as on the command line)."""
    spec = pipeline.steps[step]
    reserved = {TASK_INPUT: request.task, TASK_OPTIONS_INPUT: request.task_options_text}
    values: dict[str, Any] = {}
    for name in TRAJECTORY_FIELDS:  # the step inputs are named as the trainer's options
        port = spec.component.inputs.get(name)
        binding = spec.inputs.get(name)
        if port is None or isinstance(binding, StepOutput):
            continue
        if isinstance(binding, ParentInput):
            source = binding.name
            value = reserved.get(source, request.parameters.get(source, pipeline.inputs.get(source)))
        elif name in request.parameters:
            value = request.parameters[name]
        else:
            value = binding if binding is not None else port.default
        if value is None and port.optional:
            continue  # unset: adding an optional input never moves the checkpoints of runs that leave it so
        values[name] = str(value)
    if TASK_INPUT in values and request.task_sha256 is not None:
        values[TASK_FILE_DIGEST] = request.task_sha256  # a task file's content decides its model
    return values


def checkpoint_key(pipeline: PipelineSpec, step: str, request: RunRequest) -> str:
    """`<run key>-<digest of the trajectory>`: where `step` of this request keeps its checkpoints."""
    return checkpoint_key_for(request.run_key, trajectory_values(pipeline, step, request))
