"""One model's configuration file: its task, gate policy, pipeline parameters and trigger scope, in TOML.

    name = "digits"             # the registered model's name; default: the file's stem
    [task]                      # ref: a built-in, "file.py:Attr" (relative to this file) or "pkg.mod:Attr"
    [task.options]              # the task's keyword arguments
    [gate]                      # primary_metric, min_improvement, floors, max_regression,
                                # first_model_floors, bootstrap_unloadable_champion, confidence;
                                # unset: the task's (confidence unset: the margin alone decides)
    [pipeline]                  # pipeline parameters, as `retrain run --param NAME=VALUE` sets them
    [trigger]                   # account, container, prefix, suffixes (default: the task's raw_suffixes),
                                # depth (folder levels below the prefix holding data; default: the task's)

`retrain init` writes one with every key explained (components/local/templates/, models/digits.toml).
Files live in `models/<name>.toml` under the working folder; RETRAIN_MODELS_DIR moves that folder. They
are read with the standard library (tomllib), torch-free, so the command line, the pipeline runners and the
front door can all read them. Everything is checked when the file is read, and each error is one line
naming the file, the key and the expected form; unknown keys are refused, since a typo would otherwise
silently leave a default in force. What only the task knows (does it load, does it report the gate's
metrics) is checked by the preflight (components/preflight.py) before any step runs.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from components.data_version import MAX_RAW_DEPTH
from components.errors import ConfigError, PipelineError
from components.run_inputs import GATE_INPUTS, RESERVED_INPUTS
from components.task_declarations import SUFFIX as _SUFFIX
from components.task_declarations import declared_raw_suffixes
from components.task_ref import (
    BUILTIN_RAW_SUFFIXES,
    DEFAULT_TASK,
    RAW_DEPTHS,
    check_task_options,
    parse_task_reference,
)
from core.gate_rules import CONFIDENCE, GATE_RULES, RESAMPLES, resampling_conflict
from core.names import check_model_name
from core.secrets import mask_secrets
from core.task_ref import TaskRef

if TYPE_CHECKING:
    from components.specs import PipelineSpec

MODELS_DIR_VARIABLE = "RETRAIN_MODELS_DIR"
DEFAULT_MODELS_DIR = "models"
CONFIG_SUFFIX = ".toml"
# Far above any real configuration (the commented template is ~4 KiB), far below a memory problem.
MAX_CONFIG_BYTES = 1024 * 1024

_TOP_KEYS = ("name", "task", "gate", "pipeline", "trigger")
_TASK_KEYS = ("ref", "options")
_TRIGGER_KEYS = ("account", "container", "prefix", "suffixes", "depth")
_METRIC = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_FAMILY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\*")
_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER = re.compile(r"(?=.{3,63}\Z)[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]")
_PREFIX_SEGMENT = re.compile(r"(?!\.{1,2}\Z)[A-Za-z0-9._=-]+")
_METRIC_FORM = "a metric name such as accuracy or mse"


def models_dir(cwd: Path, environ: Mapping[str, str]) -> Path:
    """Where model configuration files live: RETRAIN_MODELS_DIR (relative to `cwd`), else `cwd/models`."""
    folder = Path(environ.get(MODELS_DIR_VARIABLE) or DEFAULT_MODELS_DIR).expanduser()
    return folder if folder.is_absolute() else Path(cwd) / folder


def config_file(name: str, cwd: Path, environ: Mapping[str, str]) -> Path:
    """`models/<name>.toml`; `name` is checked first, so no path is ever built from `../x` or a newline."""
    check_model_name(name, "model name", ConfigError)
    return models_dir(cwd, environ) / f"{name}{CONFIG_SUFFIX}"


@dataclass(frozen=True)
class TaskConfig:
    """`[task]`: the reference as written, the checked reference (a task file made absolute), options."""

    ref: str
    reference: TaskRef
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The reference as a run request carries it (a task file by its absolute path)."""
        return self.reference.text


@dataclass(frozen=True)
class GateConfig:
    """`[gate]`: the register step's policy; None leaves a part to the task's default."""

    primary_metric: str | None = None
    min_improvement: float | None = None
    floors: Mapping[str, float] | None = None
    max_regression: Mapping[str, float] | None = None
    first_model_floors: Mapping[str, float] | None = None
    bootstrap_unloadable_champion: bool | None = None
    confidence: float | None = None  # None: the margin alone, no bootstrap

    def parameters(self) -> dict[str, Any]:
        """The register step's inputs of the parts that are set (components/register.yml)."""
        values: dict[str, Any] = {}
        if self.primary_metric is not None:
            values["primary_metric"] = self.primary_metric
        if self.min_improvement is not None:
            values["min_improvement"] = self.min_improvement
        for name in ("floors", "max_regression", "first_model_floors"):
            bounds = getattr(self, name)
            if bounds is not None:
                values[name] = bounds_text(bounds)
        if self.bootstrap_unloadable_champion is not None:
            values["bootstrap_unloadable_champion"] = str(self.bootstrap_unloadable_champion).lower()
        if self.confidence is not None:
            values[CONFIDENCE] = self.confidence
        return values


def bounds_text(bounds: Mapping[str, float]) -> str:
    """{'accuracy': 0.8} -> 'accuracy=0.8', the gate's METRIC=NUMBER[,...] form; {} -> 'none'."""
    return ",".join(f"{name}={float(value)!r}" for name, value in bounds.items()) or "none"


@dataclass(frozen=True)
class TriggerScope:
    """`[trigger]`: which landing blobs are this model's data. `suffixes` None: the task's raw suffixes;
    `depth` None: the task's (how many folder levels below the prefix hold its raw files)."""

    account: str | None = None
    container: str | None = None
    prefix: str = ""
    suffixes: tuple[str, ...] | None = None
    depth: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    name: str
    path: Path
    task: TaskConfig
    gate: GateConfig = field(default_factory=GateConfig)
    pipeline: Mapping[str, Any] = field(default_factory=dict)
    trigger: TriggerScope = field(default_factory=TriggerScope)

    def parameters(self) -> dict[str, Any]:
        """The run request's parameters: the pipeline's, and the register step's gate inputs."""
        return {**self.pipeline, **self.gate.parameters()}

    def trigger_suffixes(self, search_path: Sequence[str] = ()) -> tuple[str, ...]:
        """The suffixes the trigger accepts: configured, else the task's raw files: a built-in's, or the
        `raw_suffixes` a user's task declares, read from its code without running it
        (components/task_declarations.py; a module task looked for on `search_path`). ConfigError, naming
        this file, when only running the task could tell."""
        if self.trigger.suffixes is not None:
            return self.trigger.suffixes
        builtin = BUILTIN_RAW_SUFFIXES.get(self.task.text)
        if builtin is not None:
            return builtin
        try:
            return declared_raw_suffixes(self.task.reference, search_path)
        except ConfigError as error:
            raise ConfigError(
                f"{self.path}: [trigger] suffixes is unset, and {error}; expected [trigger] suffixes = "
                '[".csv"], the files its task reads'
            ) from None

    def trigger_depth(self) -> int:
        """How many folder levels below the prefix the trigger accepts: configured, else a built-in task's
        (tabular 1, image 2: its class folders), else 1. A user's task says `depth = 2` for class folders:
        a blob deeper than its data is rejected by the front door rather than pinned where the task may not
        look for it."""
        if self.trigger.depth is not None:
            return self.trigger.depth
        return RAW_DEPTHS.get(self.task.text, 1)  # only built-ins are listed


# -- reading --------------------------------------------------------------------------------------------


class _Reader:
    """Checks one file's values; every error names the file and the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, problem: str, expected: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key} {problem}; expected {expected}")

    def table(self, document: Mapping[str, Any], key: str, label: str) -> dict[str, Any]:
        value = document.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(label, f"is {_shown(value)}", f"a table ({label} ...)")
        return value

    def known(self, table: Mapping[str, Any], allowed: tuple[str, ...], label: str) -> None:
        unknown = sorted(set(table) - set(allowed))
        if unknown:
            where = f"{label} key" if label else "key"
            raise self.fail(f"{where} {unknown[0]!r}", "is not known", f"one of {', '.join(allowed)}")

    def text(
        self, table: Mapping[str, Any], key: str, label: str, pattern: re.Pattern[str], form: str
    ) -> str:
        value = table[key]
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise self.fail(f"{label}.{key}" if label else key, f"is {_shown(value)}", form)
        return value

    def number(self, value: Any, key: str, minimum: float | None) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(key, f"is {_shown(value)}", "a finite number")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"is {value}", f"a number >= {minimum:g}")
        return float(value)

    def bounds(
        self, gate: Mapping[str, Any], key: str, minimum: float | None, family: bool
    ) -> dict[str, float]:
        value = gate[key]
        if not isinstance(value, dict):
            raise self.fail(f"[gate] {key}", f"is {_shown(value)}", "a table of METRIC = NUMBER")
        bounds = {}
        for metric, bound in value.items():
            if not (_METRIC.fullmatch(metric) or (family and _FAMILY.fullmatch(metric))):
                form = _METRIC_FORM + (', or a family such as "recall_*"' if family else "")
                raise self.fail(f"[gate] {key}", f"names {metric!r}", form)
            bounds[metric] = self.number(bound, f"[gate] {key}.{metric}", minimum)
        return bounds


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, str) else repr(mask_secrets(value))


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's TOML, every way it can fail one line naming the file: read with a size bound (a
    configuration is a few KiB; `--config /dev/zero` must not read until memory runs out)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such file; expected a model configuration (`retrain init NAME` writes one)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder; expected a model configuration file (NAME.toml)") from None
    except OSError as error:
        raise ConfigError(
            f"{path}: cannot be read ({error.strerror or error}); expected a readable model configuration"
        ) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{path}: larger than {MAX_CONFIG_BYTES // 1024} KiB; expected a model configuration file "
            "(a few KiB of TOML)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path}: byte {error.start} is not UTF-8; expected TOML saved as UTF-8 text"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML ({error})") from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively: a deep one exhausts the stack.
        raise ConfigError(
            f"{path}: arrays or tables nested too deeply; expected TOML nested a few levels at most"
        ) from None


def _task(reader: _Reader, document: Mapping[str, Any]) -> TaskConfig:
    table = reader.table(document, "task", "[task]")
    reader.known(table, _TASK_KEYS, "[task]")
    ref = table.get("ref", DEFAULT_TASK)
    if not isinstance(ref, str):
        raise reader.fail("[task] ref", f"is {_shown(ref)}", "text naming the task")
    options = reader.table(table, "options", "[task.options]")
    try:
        reference = parse_task_reference(ref, reader.path.parent, f"{reader.path}: [task] ref")
        checked = check_task_options(options, f"{reader.path}: [task.options]")
    except PipelineError as error:
        raise ConfigError(str(error)) from None
    return TaskConfig(ref, reference, MappingProxyType(checked))


def _gate(reader: _Reader, document: Mapping[str, Any]) -> GateConfig:
    gate = reader.table(document, "gate", "[gate]")
    reader.known(gate, GATE_INPUTS, "[gate]")
    values: dict[str, Any] = {}
    if "primary_metric" in gate:
        values["primary_metric"] = reader.text(gate, "primary_metric", "[gate]", _METRIC, _METRIC_FORM)
    if "min_improvement" in gate:
        values["min_improvement"] = reader.number(gate["min_improvement"], "[gate] min_improvement", 0.0)
    for key, minimum, family in (
        ("floors", None, False),
        ("max_regression", 0.0, True),
        ("first_model_floors", None, False),
    ):
        if key in gate:
            values[key] = MappingProxyType(reader.bounds(gate, key, minimum, family))
    if "bootstrap_unloadable_champion" in gate:
        flag = gate["bootstrap_unloadable_champion"]
        if not isinstance(flag, bool):
            raise reader.fail("[gate] bootstrap_unloadable_champion", f"is {_shown(flag)}", "true or false")
        values["bootstrap_unloadable_champion"] = flag
    if CONFIDENCE in gate:
        rule = GATE_RULES[CONFIDENCE]
        confidence = gate[CONFIDENCE]
        if isinstance(confidence, str) or not rule.fits(confidence):  # a TOML string is no number
            raise reader.fail(f"[gate] {CONFIDENCE}", f"is {_shown(confidence)}", rule.expected)
        values[CONFIDENCE] = float(confidence)
    return GateConfig(**values)


def _pipeline(reader: _Reader, document: Mapping[str, Any], spec: PipelineSpec) -> dict[str, Any]:
    from components.parameters import check_parameters, parameter_ports, parameter_refusal

    table = reader.table(document, "pipeline", "[pipeline]")
    for name in table:
        if name in GATE_INPUTS:
            raise reader.fail(f"[pipeline] {name}", "is a gate setting", f"it under [gate] as {name} = ...")
        if name in RESERVED_INPUTS:
            raise reader.fail(
                f"[pipeline] {name}", "is set by the run itself", "the task under [task], the rest left out"
            )
    try:
        check_parameters(spec, table)
    except PipelineError as error:
        raise ConfigError(f"{reader.path}: [pipeline] {error}") from None
    ports = parameter_ports(spec)
    for name, value in table.items():
        port = ports.get(name)
        refusal = parameter_refusal(name, value, port) if port is not None else None
        if refusal is not None:
            raise reader.fail(f"[pipeline] {name}", f"is {_shown(value)}", refusal)
    return table


def _prefix(reader: _Reader, value: Any) -> str:
    trimmed = value.removesuffix("/") if isinstance(value, str) else None
    segments = trimmed.split("/") if trimmed else []
    if trimmed is None or not all(_PREFIX_SEGMENT.fullmatch(segment) for segment in segments):
        raise reader.fail(
            "[trigger] prefix",
            f"is {_shown(value)}",
            "folder names of letters, digits, '.', '_', '=' or '-' separated by single '/' (no leading '/', "
            "no '..'); \"\" for the container's root",
        )
    return trimmed


def _trigger(reader: _Reader, document: Mapping[str, Any]) -> TriggerScope:
    table = reader.table(document, "trigger", "[trigger]")
    reader.known(table, _TRIGGER_KEYS, "[trigger]")
    account = container = suffixes = depth = None
    if "account" in table:
        account = reader.text(table, "account", "[trigger]", _ACCOUNT, "a storage account name of 3-24 "
                              "lowercase letters or digits")  # fmt: skip
    if "container" in table:
        container = reader.text(table, "container", "[trigger]", _CONTAINER, "a container name of 3-63 "
                                "lowercase letters, digits or single '-', starting and ending with a letter "
                                "or digit")  # fmt: skip
    prefix = _prefix(reader, table["prefix"]) if "prefix" in table else ""
    if "suffixes" in table:
        value = table["suffixes"]
        form = 'a non-empty list of file suffixes such as [".csv", ".parquet"] (lowercase, with the dot)'
        if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
            raise reader.fail("[trigger] suffixes", f"is {_shown(value)}", form)
        bad = [suffix for suffix in value if not _SUFFIX.fullmatch(suffix)]
        if bad or len(set(value)) != len(value):
            raise reader.fail("[trigger] suffixes", f"has {bad[0] if bad else 'a repeated suffix'!r}", form)
        suffixes = tuple(value)
    if "depth" in table:
        value = table["depth"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RAW_DEPTH:
            raise reader.fail(
                "[trigger] depth",
                f"is {_shown(value)}",
                f"a whole number from 1 (files directly under the prefix) to {MAX_RAW_DEPTH}; 2 also takes "
                "one level of sub-folders (class folders)",
            )
        depth = value
    return TriggerScope(account, container, prefix, suffixes, depth)


def load_model_config(path: Path, pipeline: PipelineSpec | None = None) -> ModelConfig:
    """Read and check one model's configuration file; `pipeline` (default components/pipeline.yml) is what
    its [pipeline] parameters are checked against."""
    from components.specs import load_pipeline_spec

    path = Path(path)
    reader = _Reader(path)
    document = _read_toml(path)
    reader.known(document, _TOP_KEYS, "")
    name = document.get("name", path.stem)
    check_model_name(name, f"{path}: name" if "name" in document else f"{path}: the file's stem", ConfigError)
    config = ModelConfig(
        name=name,
        path=path,
        task=_task(reader, document),
        gate=_gate(reader, document),
        pipeline=MappingProxyType(_pipeline(reader, document, pipeline or load_pipeline_spec())),
        trigger=_trigger(reader, document),
    )
    # A confidence the file's resample count (or the default) can never support: no run of it would certify.
    names = (f"[gate] {CONFIDENCE}", f"[pipeline] {RESAMPLES}")
    conflict = resampling_conflict(config.gate.confidence, config.pipeline.get(RESAMPLES), names)
    if conflict is not None:
        raise ConfigError(f"{path}: {conflict}")
    return config


def find_model_config(
    name: str, cwd: Path, environ: Mapping[str, str], pipeline: PipelineSpec | None = None
) -> ModelConfig | None:
    """`models/<name>.toml` read and checked, or None when there is no such file."""
    path = config_file(name, cwd, environ)
    if not path.is_file():
        return None
    config = load_model_config(path, pipeline)
    if config.name != name:
        raise ConfigError(
            f"{path}: name {config.name!r} differs from the file's stem {name!r}; expected them to agree "
            "(or pass the file with --config)"
        )
    return config
