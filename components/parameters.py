"""The parameters a run may set, and the values each accepts: one check for every caller.

A parameter names a pipeline input (`epochs`) or a component input that the pipeline leaves unbound
(`checkpoint_every_steps`; Azure ML pipelines have no optional inputs); an input that reads another step's
output, or one the run sets itself (components/run_inputs.py), cannot be set. A value must suit its input's
type, bounds and choices in the component YAML, and a trainer's or the gate's own rule. The local runner,
the Azure ML builder, a model's configuration file, `retrain run|submit --param` and the front door's
RETRAIN_PIPELINE_PARAMETERS all check by these functions, so a value one of them accepts no other refuses.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from components.errors import SubmissionError
from components.run_inputs import RESERVED_INPUTS
from components.specs import ParentInput, PipelineSpec, Port, StepOutput
from core.blob_urls import EXPECTED_BLOB_URL, parse_blob_url
from core.gate_rules import GATE_RULES
from core.secrets import mask_secrets
from core.storage.locations import parse_location
from core.text import quoted
from core.train_rules import TRAIN_RULES

# The register component's input naming the lock blob that serialises champion changes across nodes.
REGISTRY_LOCK_INPUT = "registry_lock"


def check_registry_lock(url: str, where: str = REGISTRY_LOCK_INPUT, *, folder: bool = False) -> str:
    """`url` if it is a blob container URL with an optional prefix, the form the register step takes on
    Azure ML; with `folder`, a local folder too (`--lock` of a register step on this machine). A URL with
    credentials (user info, a SAS query) is refused, its secret masked: the lock authenticates with the
    managed identity, or the emulator's connection string."""
    if parse_location(url, where, SubmissionError).folder is not None:
        if folder:
            return url
        raise SubmissionError(
            f"{where} {quoted(mask_secrets(url), 120)}: a folder, which register steps on other nodes "
            f"cannot share; expected {EXPECTED_BLOB_URL}"
        )
    parse_blob_url(url, where, SubmissionError)
    return url


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
