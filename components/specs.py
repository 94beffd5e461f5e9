"""The component and pipeline YAMLs, read as plain data for the local runner and the builders.

The YAMLs are the single source of truth: Azure ML loads them with `azure.ai.ml.load_component`, and the
local runner executes the very `command:` lines read here. This module reads them with PyYAML only, so the
runner and the Function App need not import azure-ai-ml to know what a step runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any

import yaml

from components.errors import SpecError

COMPONENTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = COMPONENTS_DIR.parent
PIPELINE_FILE = COMPONENTS_DIR / "pipeline.yml"
ENVIRONMENT_FILE = COMPONENTS_DIR / "environment" / "environment.yml"
COMPUTE_DIR = COMPONENTS_DIR / "compute"
COMPUTE_FILES = {
    "cpu": COMPUTE_DIR / "cpu-cluster.yml",
    "gpu_spot": COMPUTE_DIR / "gpu-spot.yml",
    "gpu_dedicated": COMPUTE_DIR / "gpu-dedicated.yml",
}
# The steps and outputs of pipeline.yml that code names: both runners report what prep prepared.
TRAIN_STEP = "train"
PREP_STEP = "prep"  # its rejected_inputs output says which raw files it left out (core/rejected_inputs.py)
PREPARED_OUTPUT = "prepared_data"  # prep's prepared data version, which a later run's prep builds on
CHECKPOINTS_OUTPUT = "checkpoints"

_PARENT_INPUT = re.compile(r"\$\{\{parent\.inputs\.(\w+)\}\}")
_STEP_OUTPUT = re.compile(r"\$\{\{parent\.jobs\.(\w+)\.outputs\.(\w+)\}\}")
_PARENT_OUTPUT = re.compile(r"\$\{\{parent\.outputs\.(\w+)\}\}")
_AZUREML_PREFIX = "azureml:"


@dataclass(frozen=True)
class Port:
    """One declared input or output of a component."""

    name: str
    type: str
    optional: bool = False
    default: Any = None
    mode: str | None = None
    # An integer or number input's inclusive bounds (`min`, `max`), which Azure ML enforces too.
    minimum: float | None = None
    maximum: float | None = None
    # A string input's allowed values (`enum`), which Azure ML enforces too.
    choices: tuple[str, ...] | None = None

    @property
    def is_path(self) -> bool:
        return self.type in ("uri_folder", "uri_file", "mlflow_model", "custom_model")


@dataclass(frozen=True)
class Distribution:
    type: str
    process_count_per_instance: int = 1


@dataclass(frozen=True)
class ComponentSpec:
    path: Path
    name: str
    version: str
    command: str
    code: Path
    environment: str
    inputs: Mapping[str, Port]
    outputs: Mapping[str, Port]
    distribution: Distribution | None = None
    instance_count: int = 1

    @property
    def reference(self) -> str:
        """How a pipeline names this exact version in a workspace: `azureml:<name>:<version>`."""
        return f"{_AZUREML_PREFIX}{self.name}:{self.version}"


@dataclass(frozen=True)
class ParentInput:
    """A step input bound to a pipeline input: `${{parent.inputs.NAME}}`."""

    name: str


@dataclass(frozen=True)
class StepOutput:
    """A step input bound to an earlier step's output: `${{parent.jobs.STEP.outputs.NAME}}`."""

    step: str
    output: str


Binding = ParentInput | StepOutput | str | int | float | bool


@dataclass(frozen=True)
class OutputSetting:
    """What a pipeline says about one step output: mode, fixed datastore path, or promotion to the parent."""

    mode: str | None = None
    path: str | None = None
    parent_output: str | None = None


@dataclass(frozen=True)
class StepSpec:
    name: str
    component: ComponentSpec
    inputs: Mapping[str, Binding]
    outputs: Mapping[str, OutputSetting]
    compute: str | None
    distribution: Distribution | None
    instance_count: int

    @property
    def upstream(self) -> frozenset[str]:
        return frozenset(binding.step for binding in self.inputs.values() if isinstance(binding, StepOutput))

    @property
    def process_count(self) -> int:
        per_instance = self.distribution.process_count_per_instance if self.distribution else 1
        return per_instance * self.instance_count


@dataclass(frozen=True)
class PipelineSpec:
    path: Path
    inputs: Mapping[str, Any]
    steps: Mapping[str, StepSpec]
    default_compute: str | None
    order: tuple[str, ...] = field(default=())

    def downstream_of(self, step: str) -> frozenset[str]:
        """Every step that consumes, directly or not, an output of `step`."""
        found: set[str] = set()
        for name in self.order:
            if self.steps[name].upstream & (found | {step}):
                found.add(name)
        return frozenset(found)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file; expected an Azure ML YAML spec") from None
    except yaml.YAMLError as error:
        raise SpecError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(document, dict):
        raise SpecError(f"{path}: expected a YAML mapping at the top level")
    return document


def _require(document: Mapping[str, Any], key: str, path: Path) -> Any:
    if key not in document:
        raise SpecError(f"{path}: missing '{key}'; every component declares name, version, command and code")
    return document[key]


def _port(name: str, declared: Any, path: Path) -> Port:
    if not isinstance(declared, dict) or "type" not in declared:
        raise SpecError(f"{path}: port '{name}' needs a mapping with a 'type' (uri_folder, string, ...)")
    return Port(
        name=name,
        type=str(declared["type"]),
        optional=bool(declared.get("optional", False)),
        default=declared.get("default"),
        mode=declared.get("mode"),
        minimum=_bound(declared, "min", name, path),
        maximum=_bound(declared, "max", name, path),
        choices=_choices(declared, name, path),
    )


def _bound(declared: Mapping[str, Any], key: str, name: str, path: Path) -> float | None:
    value = declared.get(key)
    if value is None:
        return None
    if (
        declared["type"] not in ("integer", "number")
        or isinstance(value, bool)
        or not isinstance(value, int | float)
    ):
        raise SpecError(
            f"{path}: port '{name}' {key} {value!r}; expected a number, on an integer or number input"
        )
    return value


def _choices(declared: Mapping[str, Any], name: str, path: Path) -> tuple[str, ...] | None:
    values = declared.get("enum")
    if values is None:
        return None
    if (
        declared["type"] != "string"
        or not isinstance(values, list)
        or not values
        or not all(isinstance(value, str) for value in values)
    ):
        raise SpecError(f"{path}: port '{name}' enum {values!r}; expected a list of texts, on a string input")
    default = declared.get("default")
    if default is not None and default not in values:
        raise SpecError(f"{path}: port '{name}' defaults to {default!r}, which its enum {values} lacks")
    return tuple(values)


def _distribution(declared: Any) -> Distribution | None:
    if not declared:
        return None
    return Distribution(str(declared["type"]), int(declared.get("process_count_per_instance", 1)))


def load_component_spec(path: Path) -> ComponentSpec:
    path = Path(path).resolve()
    document = _read_yaml(path)
    if document.get("type", "command") != "command":
        raise SpecError(f"{path}: type {document['type']!r}; expected a command component")
    resources = document.get("resources") or {}
    return ComponentSpec(
        path=path,
        name=str(_require(document, "name", path)),
        version=str(_require(document, "version", path)),
        command=" ".join(str(_require(document, "command", path)).split()),
        code=(path.parent / str(_require(document, "code", path))).resolve(),
        environment=str(_require(document, "environment", path)),
        inputs={name: _port(name, port, path) for name, port in (document.get("inputs") or {}).items()},
        outputs={name: _port(name, port, path) for name, port in (document.get("outputs") or {}).items()},
        distribution=_distribution(document.get("distribution")),
        instance_count=int(resources.get("instance_count", 1)),
    )


def _binding(value: Any) -> Binding:
    if isinstance(value, dict):
        value = value.get("path", value.get("value"))
    if isinstance(value, str):
        if match := _PARENT_INPUT.fullmatch(value):
            return ParentInput(match[1])
        if match := _STEP_OUTPUT.fullmatch(value):
            return StepOutput(match[1], match[2])
    return value


def _output_setting(value: Any) -> OutputSetting:
    if isinstance(value, str) and (match := _PARENT_OUTPUT.fullmatch(value)):
        return OutputSetting(parent_output=match[1])
    if isinstance(value, dict):
        return OutputSetting(mode=value.get("mode"), path=value.get("path"))
    return OutputSetting()


def _step(name: str, job: Mapping[str, Any], pipeline_path: Path) -> StepSpec:
    component_ref = job.get("component")
    if not isinstance(component_ref, str) or component_ref.startswith(_AZUREML_PREFIX):
        raise SpecError(f"{pipeline_path}: step '{name}' must name its component YAML as a relative path")
    component = load_component_spec(pipeline_path.parent / component_ref)
    inputs = {key: _binding(value) for key, value in (job.get("inputs") or {}).items()}
    unknown = sorted(set(inputs) - set(component.inputs))
    if unknown:
        raise SpecError(
            f"{pipeline_path}: step '{name}' binds {unknown}; {component.name} does not declare them"
        )
    resources = job.get("resources") or {}
    return StepSpec(
        name=name,
        component=component,
        inputs=inputs,
        outputs={key: _output_setting(value) for key, value in (job.get("outputs") or {}).items()},
        compute=job.get("compute"),
        distribution=_distribution(job.get("distribution")) or component.distribution,
        instance_count=int(resources.get("instance_count", component.instance_count)),
    )


def _topological_order(steps: Mapping[str, StepSpec], path: Path) -> tuple[str, ...]:
    for step in steps.values():
        missing = sorted(step.upstream - set(steps))
        if missing:
            raise SpecError(f"{path}: step '{step.name}' reads outputs of unknown steps {missing}")
    sorter = TopologicalSorter({name: step.upstream for name, step in steps.items()})
    try:
        return tuple(sorter.static_order())
    except CycleError as error:
        raise SpecError(f"{path}: steps form a cycle {error.args[1]}; a pipeline must be acyclic") from None


def _default(declared: Any) -> Any:
    return declared.get("path", declared.get("default")) if isinstance(declared, dict) else declared


def load_pipeline_spec(path: Path = PIPELINE_FILE) -> PipelineSpec:
    path = Path(path).resolve()
    document = _read_yaml(path)
    jobs = document.get("jobs") or {}
    if not jobs:
        raise SpecError(f"{path}: no 'jobs'; a pipeline needs at least one step")
    steps = {name: _step(name, job, path) for name, job in jobs.items()}
    settings = document.get("settings") or {}
    return PipelineSpec(
        path=path,
        inputs={name: _default(value) for name, value in (document.get("inputs") or {}).items()},
        steps=steps,
        default_compute=settings.get("default_compute"),
        order=_topological_order(steps, path),
    )


def load_yaml(path: Path) -> dict[str, Any]:
    """Any other spec (environment, compute) as a mapping, with the same one-line errors."""
    return _read_yaml(Path(path))
