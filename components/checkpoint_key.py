"""Whose checkpoints a run may resume: the checkpoint key, the run key plus the training's trajectory.

The run key (model name + data version) names the logical run for the front door: its job name, and with
it exactly-once submission. Two runs of one run key can still train differently, with other epochs, seed,
batch size, learning rate, task or task options, and one must never resume the other's checkpoints: the
learning-rate schedule alone depends on the total number of steps. (A 3-epoch run once resumed a 6-epoch
run's step 75 and kept that as its 3-epoch model.) So a step's durable output, train's checkpoints, lives
under a checkpoint key: `<run key>-<digest>`, the digest of the values the step reads for the options
that decide the trajectory (`TRAJECTORY_INPUTS`, and a task file's content). Options a resume may change
(the checkpoint interval and how many to keep, the mean time between evictions, the progress display, the
process count) are left out, so a rerun with other such values still resumes.

Values are resolved as the step receives them: the request's parameter, else the pipeline's input, else
the component's default; so `--epochs 5` and pipeline.yml's default of 5 are one key. Locally the key
names `<state>/checkpoints/<key>/`; on Azure ML the datastore path `retrain/checkpoints/<key>/`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from components.request import RunRequest
from components.run_inputs import TASK_INPUT, TASK_OPTIONS_INPUT
from components.specs import ParentInput, PipelineSpec, StepOutput

# training/engine/config.py TRAJECTORY_FIELDS, as step inputs (a test keeps the two lists equal): the
# trainer refuses to resume a checkpoint under other values of these.
TRAJECTORY_INPUTS = (
    "epochs",
    "seed",
    "global_batch_size",
    "learning_rate",
    "weight_decay",
    "warmup_steps",
    TASK_INPUT,
    TASK_OPTIONS_INPUT,
)
_DIGEST_LENGTH = 12


def trajectory_values(pipeline: PipelineSpec, step: str, request: RunRequest) -> dict[str, str]:
    """The trajectory inputs `step` declares, with the values this request gives them, as text (a
    parameter `2` and `"2"` are one value, as on the command line)."""
    spec = pipeline.steps[step]
    reserved = {TASK_INPUT: request.task, TASK_OPTIONS_INPUT: request.task_options_text}
    values: dict[str, Any] = {}
    for name in TRAJECTORY_INPUTS:
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
        values[name] = str(value)
    if TASK_INPUT in values and request.task_sha256 is not None:
        values["task_file_sha256"] = request.task_sha256  # a task file's content decides its model
    return values


def checkpoint_key(pipeline: PipelineSpec, step: str, request: RunRequest) -> str:
    """`<run key>-<digest of the trajectory>`: where `step` of this request keeps its checkpoints."""
    canonical = json.dumps(trajectory_values(pipeline, step, request), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:_DIGEST_LENGTH]
    return f"{request.run_key}-{digest}"
