"""Build the Azure ML pipeline job from the same YAMLs the local runner executes.

The step graph, bindings, computes and distribution come from components/pipeline.yml (read as plain data by
components/specs.py), and each step's component from its YAML through `azure.ai.ml.load_component`, so the
built job and pipeline.yml cannot drift. What a submission adds is what pins the run: the data input, the
component versions, the compute per step, the process count, the trigger metadata (tags), the job name
derived from the run key (Azure ML itself refuses a duplicate), how each step reads the pinned data
(components/azureml/input_modes.py), and the train step's checkpoint path, by the checkpoint key
(components/checkpoint_key.py): a resubmitted job resumes there, one with other epochs never.

azure-ai-ml is imported inside the functions that need it: the Function App imports this module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from components.azureml.input_modes import compute_disks, input_mode
from components.checkpoint_key import checkpoint_key
from components.errors import SpecError, SubmissionError
from components.parameters import REGISTRY_LOCK_INPUT, check_registry_lock
from components.request import RunRequest
from components.run_inputs import (
    DATA_INPUT,
    PREVIOUS_PREPARED_INPUT,
    RESERVED_INPUTS,
    TRIGGER_INPUT,
    UNPINNED_DATA_VERSION,
    reserved_values,
    trigger_argument,
)
from components.specs import (
    CHECKPOINTS_OUTPUT,
    PIPELINE_FILE,
    TRAIN_STEP,
    ParentInput,
    PipelineSpec,
    StepOutput,
    StepSpec,
    load_pipeline_spec,
    load_yaml,
)
from components.task_ref import DEFAULT_TASK, parse_task_reference, snapshot_text
from core.task_ref import secret_options

if TYPE_CHECKING:
    from azure.ai.ml.entities import PipelineJob

# The datastore the pipeline keeps its shared state in (snapshots, checkpoints, the registry lock), by name.
DATASTORE_SETTING = "RETRAIN_AZUREML_DATASTORE"
DEFAULT_DATASTORE = "workspaceblobstore"
CHECKPOINTS_ROOT = "retrain/checkpoints"

_AZUREML = "azureml:"
_PINNED_ASSET = re.compile(r"azureml:(?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]*):(?P<version>[A-Za-z0-9_.-]+)")
_LATEST_ASSET = re.compile(r"azureml:[A-Za-z0-9_][A-Za-z0-9_.-]*@latest")
_DATA_URI_SCHEMES = ("azureml://", "https://", "wasbs://", "abfss://")
_COMPUTE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{1,31}")
_DATASTORE_NAME = re.compile(r"[A-Za-z0-9_]{1,255}")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_EXPECTED = {"integer": "an integer", "number": "a number", "boolean": "true or false"}


def check_datastore_name(name: str, where: str = "datastore") -> str:
    """`name` if it is an Azure ML datastore's name; `where` names the flag or setting it came from."""
    if not _DATASTORE_NAME.fullmatch(name):
        raise SubmissionError(
            f"{where} {name!r}: expected a datastore name (letters, digits, '_'), such as {DEFAULT_DATASTORE}"
        )
    return name


def check_pipeline_task_options(options: Mapping[str, Any], where: str = "task options") -> None:
    """Refuses a task secret's value (core/task_ref.py) in an Azure ML pipeline: a job shows its inputs
    (and any environment variable it sets) to every reader of the workspace, and a step can be handed no
    value a job would not show. The task reads such a secret itself, from the workspace's Key Vault; the
    placeholder `***` passes, for a training environment that carries RETRAIN_TASK_SECRETS."""
    secrets = sorted(secret_options(options))
    if secrets:
        raise SubmissionError(
            f"{where}: {secrets} hold the value of a secret, which an Azure ML job shows to every reader of "
            "the workspace; read it in the task from the workspace's Key Vault (the compute's managed "
            "identity) instead of passing it as a task option"
        )


def checkpoints_path(datastore: str, key: str) -> str:
    """Where a run keeps its checkpoints, by its checkpoint key: the same folder for every attempt of it."""
    return f"azureml://datastores/{datastore}/paths/{CHECKPOINTS_ROOT}/{key}/"


def compute_name(name: str) -> str:
    """The plain name of a compute given as `name` or `azureml:name`.

    A step's compute goes to azure-ai-ml as the plain name: that is what loading `compute: azureml:x` from
    YAML yields, and `jobs.create_or_update` looks a node's compute up by exactly that string (a prefixed
    one is asked for as `computes/azureml:x` and is not found). The job's YAML form still says azureml:x."""
    plain = name.removeprefix(_AZUREML)
    if not _COMPUTE_NAME.fullmatch(plain):
        raise SubmissionError(
            f"compute {name!r}: expected a compute name (a letter, then 2-32 letters, digits or '-'), "
            "optionally prefixed with 'azureml:'"
        )
    return plain


def compute_reference(name: str) -> str:
    return f"{_AZUREML}{compute_name(name)}"


def is_data_uri(uri: str, allow_latest: bool = False) -> bool:
    """Whether an Azure ML job can read `uri` as data: a pinned asset (or its latest version), or a URI of
    a datastore path or storage; a local folder is not one."""
    if _PINNED_ASSET.fullmatch(uri) or uri.startswith(_DATA_URI_SCHEMES):
        return True
    return allow_latest and _LATEST_ASSET.fullmatch(uri) is not None


def _check_data_uri(uri: str, allow_latest: bool, what: str = "data") -> None:
    if is_data_uri(uri, allow_latest):
        return
    latest = ", azureml:<asset>@latest" if allow_latest else ""
    raise SubmissionError(
        f"{what} {uri!r}: expected azureml:<asset>:<version>{latest} or an "
        "azureml://datastores/<datastore>/paths/<prefix>/ URI"
    )


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class PipelineBuild:
    """Everything one built pipeline job depends on, validated before azure-ai-ml is touched."""

    model_name: str
    data_uri: str
    checkpoints_path: str
    job_name: str | None = None
    display_name: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    trigger: str = "manual"
    raw_data_version: str = UNPINNED_DATA_VERSION
    parameters: Mapping[str, Any] = field(default_factory=dict)
    compute: Mapping[str, str] = field(default_factory=dict)
    processes_per_instance: int = 1
    instance_count: int = 1
    component_versions: Mapping[str, str] = field(default_factory=dict)
    registered_components: bool = False
    allow_latest_data: bool = False
    # The task as the steps see it (a task file by its place in the code snapshot, `user_tasks/...`), its
    # options as JSON text, the local task file the snapshot must carry, and the staged code snapshot
    # (components/azureml/code_snapshot.py; with or without a task file), which every component's `code` then
    # points at.
    task: str = DEFAULT_TASK
    task_options: str = "{}"
    task_file: Path | None = None
    code_folder: Path | None = None
    # The register step's lock, a blob URL prefix (components/azureml/registry_lock.py derives it from the
    # datastore); a `registry_lock` parameter wins. None: the step's default, a lock folder on its node.
    registry_lock: str | None = None
    # The prepared data version the prep step builds on (RunRequest.previous_prepared), a URI Azure ML reads:
    # set on the prep step's `previous_prepared` input.
    previous_prepared: str | None = None
    # The pinned raw data's bytes (DataRef.size_bytes), which choose how each step reads it: downloaded when
    # it fits its node's disk comfortably, else mounted (components/azureml/input_modes.py). None: Azure
    # ML's default.
    data_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_data_uri(self.data_uri, self.allow_latest_data)
        if self.previous_prepared is not None:
            _check_data_uri(
                self.previous_prepared, False, f"previous prepared data ({PREVIOUS_PREPARED_INPUT})"
            )
        for lock in (self.registry_lock, self.parameters.get(REGISTRY_LOCK_INPUT)):
            if lock is not None:
                check_registry_lock(str(lock), f"registry lock {REGISTRY_LOCK_INPUT}")
        if self.task_file is not None and self.registered_components:
            raise SubmissionError(
                f"task file {self.task_file}: registered components run the code they were published with, "
                "which does not hold it; drop --registered-components, or install the task as a package in "
                "the environment and name it package.module:Attr"
            )
        if not self.checkpoints_path.startswith("azureml://datastores/"):
            raise SubmissionError(
                f"checkpoints path {self.checkpoints_path!r}: expected azureml://datastores/<name>/paths/<path>/"
            )
        if self.data_bytes is not None and (
            isinstance(self.data_bytes, bool) or not isinstance(self.data_bytes, int) or self.data_bytes < 0
        ):
            raise SubmissionError(
                f"data size {self.data_bytes!r}: expected the data's bytes, a whole number >= 0"
            )
        if self.processes_per_instance < 1 or self.instance_count < 1:
            raise SubmissionError(
                f"{self.processes_per_instance} processes on {self.instance_count} nodes: expected positive "
                "counts of GPUs per node and of nodes"
            )
        for step, version in self.component_versions.items():
            if not _VERSION.fullmatch(str(version)):
                raise SubmissionError(
                    f"component version {step}={version!r}: expected a version such as '1' or '2.0.1'"
                )
        for name in ("tags", "parameters", "compute", "component_versions"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    @classmethod
    def for_request(
        cls,
        request: RunRequest,
        attempt: int = 0,
        *,
        datastore: str = DEFAULT_DATASTORE,
        compute: Mapping[str, str] | None = None,
        registered_components: bool = False,
        pipeline_file: Path = PIPELINE_FILE,
        registry_lock: str | None = None,
    ) -> PipelineBuild:
        """The build for one attempt of a request; `compute` overrides the request's per-step compute (the
        dedicated fallback). `pipeline_file` gives the defaults the checkpoint key resolves."""
        check_datastore_name(datastore)
        check_pipeline_task_options(request.task_options, f"model {request.model_name!r}: task options")
        pinned = _PINNED_ASSET.fullmatch(request.data.uri)
        if pinned and pinned["version"] != request.data.version:
            raise SubmissionError(
                f"data {request.data.uri!r} pins version {pinned['version']}, but the request's data version "
                f"is {request.data.version}; expected azureml:<asset>:{request.data.version}"
            )
        suffix = f" (attempt {attempt})" if attempt else ""
        task = parse_task_reference(request.task, None, "task")
        return cls(
            model_name=request.model_name,
            data_uri=request.data.uri,
            checkpoints_path=checkpoints_path(
                datastore, checkpoint_key(load_pipeline_spec(pipeline_file), TRAIN_STEP, request)
            ),
            job_name=request.job_name(attempt),
            display_name=f"retrain {request.model_name} on {request.data.version}{suffix}",
            tags={**request.tags(), "retrain.attempt": str(attempt)},
            trigger=trigger_argument(request.trigger),
            raw_data_version=request.data.version,
            parameters=request.parameters,
            compute={**request.compute, **(compute or {})},
            processes_per_instance=request.processes_per_instance,
            instance_count=request.instance_count,
            component_versions=request.component_versions,
            registered_components=registered_components,
            task=snapshot_text(task),
            task_options=request.task_options_text,
            task_file=task.path,
            registry_lock=registry_lock,
            previous_prepared=request.previous_prepared,
            data_bytes=request.data.size_bytes,
        )


# -- pipeline inputs ------------------------------------------------------------------------------------


def _input_ports(spec: PipelineSpec) -> dict[str, tuple[str, str, str]]:
    """pipeline input -> (step, port, port type) of a step input it feeds."""
    ports: dict[str, tuple[str, str, str]] = {}
    for step in spec.steps.values():
        for port, binding in step.inputs.items():
            if isinstance(binding, ParentInput):
                ports.setdefault(binding.name, (step.name, port, step.component.inputs[port].type))
    return ports


def _coerce(name: str, value: Any, target: tuple[str, str, str] | None) -> Any:
    if target is None or not isinstance(value, str):
        return value
    step, port, kind = target
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value)
        if kind == "boolean":
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
    except ValueError:
        raise SubmissionError(
            f"parameter {name}={value!r}: expected {_EXPECTED[kind]} (it sets {step}.{port})"
        ) from None
    return value


def _unbound_component_inputs(spec: PipelineSpec) -> dict[str, tuple[str, str, str]]:
    """Component inputs no step binds (train's optional checkpoint_every_steps): name -> (step, port, type).

    Azure ML pipeline YAML has no optional pipeline inputs, so optional component inputs stay unbound there
    and a run sets them on the step itself."""
    return {
        name: (step.name, name, port.type)
        for step in spec.steps.values()
        for name, port in step.component.inputs.items()
        if name not in step.inputs
    }


def _step_literals(step: StepSpec, build: PipelineBuild) -> dict[str, Any]:
    # Every step that declares an input left unbound gets the parameter (the gate policy goes to prep,
    # which checks it first, and to register, which applies it), as the local runner gives it.
    literals = {
        name: _coerce(name, value, (step.name, name, step.component.inputs[name].type))
        for name, value in build.parameters.items()
        if name in step.component.inputs and name not in step.inputs
    }
    if build.registry_lock and REGISTRY_LOCK_INPUT in step.component.inputs:
        literals.setdefault(REGISTRY_LOCK_INPUT, build.registry_lock)  # a `registry_lock` parameter wins
    if build.previous_prepared and PREVIOUS_PREPARED_INPUT in step.component.inputs:
        from azure.ai.ml import Input

        literals[PREVIOUS_PREPARED_INPUT] = Input(
            type=step.component.inputs[PREVIOUS_PREPARED_INPUT].type,
            path=_input_path(build.previous_prepared),
        )
    return literals


def _input_path(uri: str) -> str:
    """A data asset as azure-ai-ml holds it once loaded from YAML: without `azureml:` (its YAML form still
    shows it). Submitting resolves `name@latest` by looking the name up as given, so a prefixed one is asked
    for as `data/azureml:name` and is not found."""
    return uri.removeprefix(_AZUREML) if _PINNED_ASSET.fullmatch(uri) or _LATEST_ASSET.fullmatch(uri) else uri


def _pipeline_inputs(build: PipelineBuild, spec: PipelineSpec) -> dict[str, Any]:
    from azure.ai.ml import Input

    ports = _input_ports(spec)
    settable = sorted(set(spec.inputs) - set(RESERVED_INPUTS))
    inputs = dict(spec.inputs)
    for name, value in build.parameters.items():
        if name in RESERVED_INPUTS:
            raise SubmissionError(
                f"parameter {name}: set by the run itself (--data, --model-name, --trigger); "
                f"expected one of {settable}"
            )
        if name in _unbound_component_inputs(spec):
            continue  # set on the step that declares it (_node), as the local runner does
        if name not in spec.inputs:
            expected = sorted({*settable, *_unbound_component_inputs(spec)})
            raise SubmissionError(
                f"parameter {name}: not an input of the pipeline; expected one of {expected}"
            )
        inputs[name] = _coerce(name, value, ports.get(name))
    reserved: dict[str, Any] = {
        **reserved_values(build.model_name, build.raw_data_version, {}, build.task, build.task_options),
        DATA_INPUT: Input(type="uri_folder", path=_input_path(build.data_uri)),
    }
    reserved[TRIGGER_INPUT] = build.trigger  # already the argument's text (a schedule sets its own)
    inputs.update({name: value for name, value in reserved.items() if name in spec.inputs})
    return inputs


# -- steps ----------------------------------------------------------------------------------------------


def _binding(value: Any) -> Any:
    if isinstance(value, ParentInput):
        return f"${{{{parent.inputs.{value.name}}}}}"
    if isinstance(value, StepOutput):
        return f"${{{{parent.jobs.{value.step}.outputs.{value.output}}}}}"
    return value


def _component(step: StepSpec, build: PipelineBuild) -> Any:
    """The loaded YAML component, or a reference to a registered version when the build asks for one."""
    from azure.ai.ml import load_component

    declared = step.component
    version = str(build.component_versions.get(step.name, declared.version))
    if build.registered_components or version != declared.version:
        if build.task_file is not None:
            raise SubmissionError(
                f"step '{step.name}': version {version} of {declared.name} is a published one, whose code "
                f"snapshot lacks the task file {build.task_file}; use the YAML's version {declared.version}"
            )
        # Another version than the YAML's can only be one published earlier: reference it, never guess it.
        return f"{_AZUREML}{declared.name}:{version}"
    component = load_component(source=declared.path)
    if build.task_file is not None and build.code_folder is None:
        raise SpecError(
            f"task file {build.task_file}: the job needs a code snapshot that holds it; stage one with "
            "components.azureml.code_snapshot.with_code_snapshot before building"
        )
    if (
        build.code_folder is not None
    ):  # a staged snapshot of the components' code (components/azureml/code_snapshot.py)
        component.code = str(build.code_folder)
    return component


def _outputs(step: StepSpec, build: PipelineBuild) -> dict[str, Any]:
    from azure.ai.ml import Output

    outputs: dict[str, Any] = {}
    for name, setting in step.outputs.items():
        if setting.parent_output:
            outputs[name] = f"${{{{parent.outputs.{setting.parent_output}}}}}"
            continue
        path = setting.path
        if (step.name, name) == (TRAIN_STEP, CHECKPOINTS_OUTPUT):
            path = build.checkpoints_path
        outputs[name] = Output(type=step.component.outputs[name].type, mode=setting.mode, path=path)
    if step.name == TRAIN_STEP and CHECKPOINTS_OUTPUT not in outputs:
        raise SpecError(
            f"{step.component.path}: the pipeline's train step must set its '{CHECKPOINTS_OUTPUT}' output "
            "(mode rw_mount) so checkpoints land on a path stable for the run"
        )
    return outputs


def _set_input_modes(node: Any, step: StepSpec, build: PipelineBuild, compute: str | None) -> None:
    """The mode of each step input the pinned raw data feeds, by its size against the step's node's disk;
    left unset (Azure ML's default, a mount) where either is unknown."""
    disk = compute_disks().get(compute_name(compute)) if compute else None
    mode = input_mode(build.data_bytes, disk)
    if mode is None:
        return
    for port, binding in step.inputs.items():
        if isinstance(binding, ParentInput) and binding.name == DATA_INPUT:
            node.inputs[port].mode = mode


def _node(step: StepSpec, build: PipelineBuild, spec: PipelineSpec) -> Any:
    from azure.ai.ml import PyTorchDistribution
    from azure.ai.ml.entities import Command, JobResourceConfiguration

    compute = build.compute.get(step.name) or step.compute or spec.default_compute
    node = Command(
        component=_component(step, build),
        inputs={
            **{name: _binding(value) for name, value in step.inputs.items()},
            **_step_literals(step, build),
        },
        outputs=_outputs(step, build),
        compute=compute_name(compute) if compute else None,
    )
    node.display_name = step.name  # how a child job names its step, for the fallback's bookkeeping
    _set_input_modes(node, step, build, compute)
    if step.name == TRAIN_STEP:
        kind = step.distribution.type if step.distribution else "pytorch"
        if kind != "pytorch":
            raise SpecError(f"{step.component.path}: train distribution {kind!r}; expected pytorch")
        node.distribution = PyTorchDistribution(process_count_per_instance=build.processes_per_instance)
        node.resources = JobResourceConfiguration(instance_count=build.instance_count)
    elif step.distribution is not None:
        node.distribution = PyTorchDistribution(
            process_count_per_instance=step.distribution.process_count_per_instance
        )
    if step.name != TRAIN_STEP and step.instance_count != 1:
        node.resources = JobResourceConfiguration(instance_count=step.instance_count)
    return node


def build_pipeline_job(build: PipelineBuild, pipeline_file: Path = PIPELINE_FILE) -> PipelineJob:
    """The pipeline job for `build`, validated locally (`PipelineJob._validate()`)."""
    from azure.ai.ml import Output
    from azure.ai.ml.entities import PipelineJob

    spec = load_pipeline_spec(pipeline_file)
    document = load_yaml(spec.path)
    unknown = sorted(set(build.compute) - set(spec.steps))
    if unknown:
        raise SubmissionError(f"compute for {unknown}: expected steps among {list(spec.order)}")
    settings = dict(document.get("settings") or {})
    default_compute = spec.default_compute
    if default_compute:
        settings["default_compute"] = compute_name(default_compute)
    job = PipelineJob(
        name=build.job_name,
        display_name=build.display_name or document.get("display_name"),
        description=document.get("description"),
        experiment_name=build.model_name,  # one experiment per model, as its local runs have
        tags=dict(build.tags),
        inputs=_pipeline_inputs(build, spec),
        outputs={
            name: Output(type=(declared or {}).get("type", "uri_folder"))
            for name, declared in (document.get("outputs") or {}).items()
        },
        jobs={name: _node(spec.steps[name], build, spec) for name in spec.order},
        settings=settings,
    )
    validate_job(job)
    return job


def validate_job(job: Any) -> None:
    """Raise a one-line SpecError unless azure-ai-ml's local validation passes."""
    result = job._validate()
    if not result.passed:
        problems = "; ".join(f"{path}: {message}" for path, message in sorted(result.error_messages.items()))
        raise SpecError(f"pipeline job {job.name or '(unnamed)'} does not validate: {problems}")
