"""Serving a registered model: an MLflow pyfunc that answers what users have, through the model's task.

A registered version's artifacts are the training's model.pt (`retrain-model/2`: task reference, options,
`info` and state dict), the user's task file when the task is one (`file.py:Attr`), and the files kept for
lineage. `mlflow.pyfunc.load_model("models:/NAME@champion")` rebuilds the model with
`load_task(ref, options).build_model(info)`, and `predict` hands the caller's input to `task.predict`: a
DataFrame read straight from a raw CSV for the tabular task, a uint8 N×H×W×3 array for the image task.

The `training` and `core` packages travel with the model (MLflow's `code_paths`), so a serving
environment needs only the pip requirements recorded beside it, not this repository. A task file is
shipped as an artifact, with the modules of its folder it imports beside it in their layout (a package
with only its imported files), and its reference is pointed at that copy when the model loads, wherever
that is; the loader puts the copy's folder on sys.path, so its imports find them there.
The same rebuild loads a champion for the gate (registry.py), so what is scored is exactly what serves.

Its neighbours: model_from_code.py is the file MLflow runs to get this pyfunc ("models from code");
scoring_server.py is `retrain serve`, which puts a champion behind MLflow's own scoring server.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow.types import DataType
from torch import nn

import core
import training
from core.errors import InputError
from core.sources import file_task_sources
from core.task_ref import parse_task_ref
from training.data.whole_numbers import whole_columns
from training.engine.outputs import load_model_file, read_model_payload
from training.tasks.base import Task, TaskData
from training.tasks.loader import load_task

log = logging.getLogger(__name__)

MODEL_KEY = "model"  # the pyfunc artifact holding model.pt
TASK_FILE_KEY = "task_file"  # the pyfunc artifact holding the user's task file, for a file task
TASK_MODULE_KEY = "task_module."  # + its name: a module (or package) of the task file's folder it imports
ARTIFACTS_FOLDER = "artifacts"  # where pyfunc puts its artifacts inside the logged model
MODEL_FROM_CODE_FILE = "model_from_code.py"  # what MLflow runs to load the model
# What the serving environment installs. Pinned to this environment's versions; MLflow adds itself.
REQUIREMENTS = ("torch", "numpy", "pandas", "pyarrow", "pillow", "cloudpickle")
# A numeric column's type at the width pandas reads a CSV column to (see serving_signature).
_CSV_WIDTH = {
    DataType.integer: DataType.long,
    DataType.long: DataType.long,
    DataType.float: DataType.double,
    DataType.double: DataType.double,
}


@dataclass(frozen=True)
class Rebuilt:
    """A model rebuilt from a model file: its task, the model in eval mode on the CPU, and its facts."""

    task: Task
    model: nn.Module
    info: Mapping[str, Any]
    task_ref: str
    task_options: Mapping[str, Any]


def served_task_ref(recorded: str, task_file: Path | None) -> str:
    """The recorded task reference, with a task file's path pointed at `task_file`, the copy shipped with
    the model: the path recorded at training time does not exist where the model is served."""
    ref = parse_task_ref(recorded, Path.cwd())
    if not ref.is_file:
        return recorded
    if task_file is None:
        raise InputError(f"task {recorded!r} is a file, but no copy of it came with the model")
    return f"{Path(task_file).resolve()}:{ref.attribute}"


def rebuild(model_file: Path, task_file: Path | None = None, task: Task | None = None) -> Rebuilt:
    """The model a model file holds, built by its task: `task`, or the one the file records, loaded with
    its recorded options (a file task from `task_file`, the copy that came with the model)."""
    if task is None:
        recorded = read_model_payload(model_file)
        task = load_task(served_task_ref(str(recorded["task"]), task_file), recorded["task_options"])
    task, model, payload = load_model_file(model_file, task=task)
    info, options = dict(payload["info"]), dict(payload["task_options"])
    return Rebuilt(task, model.cpu().eval(), info, str(payload["task"]), options)


def predict(rebuilt: Rebuilt, inputs: Any) -> Any:
    """The task's answer for `inputs`, the model in eval mode, gradients off."""
    rebuilt.model.eval()
    with torch.no_grad():
        return rebuilt.task.predict(rebuilt.model, rebuilt.info, inputs)


class TaskModel(mlflow.pyfunc.PythonModel):
    """The pyfunc MLflow serves: rebuilt from its artifacts on load; `predict` is the task's."""

    def load_context(self, context: Any) -> None:
        artifacts = context.artifacts
        task_file = Path(artifacts[TASK_FILE_KEY]) if TASK_FILE_KEY in artifacts else None
        self._rebuilt = rebuild(Path(artifacts[MODEL_KEY]), task_file)

    # The annotation is for MLflow, which reads it when the class is defined: a DataFrame (or ndarray) hint
    # is one it infers no schema from, so it passes every input through untouched (a task takes arrays too)
    # and does not warn, as it does for no hint at all. Inputs are checked against the logged signature.
    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
        return predict(self._rebuilt, model_input)


@dataclass(frozen=True)
class ServedModel:
    """What to log as a serving model: the model file and its task, an input example in the form callers
    have, and other files to keep beside it (in the model's `artifacts/` folder)."""

    model_file: Path
    rebuilt: Rebuilt
    task_file: Path | None
    input_example: Any
    extra_files: tuple[Path, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [path.name for path in self.artifact_paths().values()]
        if len(set(names)) != len(names):
            raise InputError(f"model artifacts {names}: their names must differ (they share one folder)")

    def artifact_paths(self, staging: Path | None = None) -> dict[str, Path]:
        """Each artifact by its key. The modules the task file imports from its folder land beside it: a
        module as its file, a package as a folder staged under `staging` with only its imported files
        (without `staging`, the package's own folder, which names it)."""
        paths = {MODEL_KEY: Path(self.model_file)}
        if self.task_file is not None:
            paths[TASK_FILE_KEY] = Path(self.task_file)
            for name, source in file_task_sources(Path(self.task_file)).items():
                top, _, inside = name.partition("/")
                if not inside:
                    if name != Path(self.task_file).name:
                        paths[f"{TASK_MODULE_KEY}{top}"] = source
                    continue
                paths[f"{TASK_MODULE_KEY}{top}"] = Path(staging or Path(self.task_file).parent) / top
                if staging is not None:
                    (staging / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, staging / name)
        for path in self.extra_files:
            paths[Path(path).name] = Path(path)
        return paths


def served_example(task: Task, data: TaskData, data_dir: Path) -> Any:
    """The task's input example, with each decimal column that the training data holds only whole numbers
    in typed as whole numbers (int64), which is how `pandas.read_csv` reads a raw file of it.

    MLflow refuses int64 into a double column, so a task that trains on floats and returns its example as
    floats, as is natural, would otherwise serve a champion that refuses its own raw files. Which columns
    are whole is read from the training data as the task names it (the training split its drift reference
    reads, `drift_features(data_dir, prepared=True)`): a numeric feature named as the column, every value
    whole, and the example's own values whole there too. A column the example types as integers is the
    task's word already (the tabular task's, from every split); any other column keeps the example's type."""
    example = task.input_example(data)
    if not isinstance(example, pd.DataFrame):
        return example
    decimal = [name for name, dtype in example.dtypes.items() if isinstance(name, str) and dtype.kind == "f"]
    if not decimal:
        return example
    try:
        reference = task.drift_features(Path(data_dir), prepared=True)
    except Exception as error:  # a task's own code, failing in any way: the types are a refinement
        log.warning(
            "task %r: its drift reference of %s could not be read (%s); columns %s are served as decimals "
            "(MLflow double), which MLflow refuses as whole numbers (int64) in process",
            getattr(task, "name", type(task).__name__),
            data_dir,
            error,
            decimal,
        )
        return example
    position = {name: index for index, name in enumerate(reference.names)}
    named = [name for name in decimal if name in position]
    if len(reference) == 0 or not named:
        return example
    in_training = whole_columns(reference.values[:, [position[name] for name in named]])
    in_example = whole_columns(example[named].to_numpy(dtype=np.float64))
    whole = [name for name, seen, shown in zip(named, in_training, in_example, strict=True) if seen and shown]
    if whole:
        log.info(
            "serving %s as whole numbers (long): the training data holds only whole numbers there", whole
        )
    return example.astype(dict.fromkeys(whole, "int64"))


def typed_inputs(rebuilt: Rebuilt) -> bool:
    """Whether the task lets MLflow check served inputs by type (its optional `typed_inputs(info)`; yes
    without one)."""
    decide = getattr(rebuilt.task, "typed_inputs", None)
    return True if decide is None else bool(decide(rebuilt.info))


def serving_signature(input_example: Any, output: Any, typed: bool = True) -> Any:
    """The signature MLflow checks inputs against, inferred from the example and the model's answer to it.

    A table column keeps the kind the example gives it (`served_example`: the training data's), at the
    width a CSV column reads to: `long` for whole numbers, `double` otherwise. That is what
    `pandas.read_csv(raw_file)` yields in process, and what `mlflow models serve` parses a `text/csv`
    body with (it hands the signature's types to read_csv, which cannot read a column as AnyType). Not
    narrower: MLflow refuses int64 into an int32 column and float64 into a float32 one. Not all
    `double`: MLflow refuses int64 into a double column, which is what read_csv makes of a whole-number
    column (only the server's parsers would convert it). A decimal in a whole-number column is refused
    in process (naming the column) and in a CSV body (naming its position); MLflow's JSON parsers cast it
    to an integer. Columns are checked by name, so a missing feature is refused by MLflow.

    Untyped (`typed=False`: a table with categories or missing values, whose columns' types vary by file)
    the signature holds the outputs only: MLflow passes every input through, `mlflow models serve` reads a
    CSV body as `pandas.read_csv` reads a file, and the task's own reading checks names and values."""
    from mlflow.models import infer_signature
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    if isinstance(output, list | tuple):
        output = np.asarray(output)
    with warnings.catch_warnings():
        # MLflow's hint that an integer column cannot hold a missing value: an integer column here is the
        # task's word that its data has whole numbers there (the tabular task refuses empty values).
        warnings.filterwarnings("ignore", "Hint: Inferred schema contains integer column", UserWarning)
        signature = infer_signature(input_example, output)
    if not typed:
        return ModelSignature(None, signature.outputs, signature.params)
    inputs = signature.inputs
    if inputs is not None and not inputs.is_tensor_spec():
        typed = [
            ColSpec(_CSV_WIDTH[spec.type], spec.name, spec.required)
            if isinstance(spec.type, DataType) and spec.type in _CSV_WIDTH
            else spec
            for spec in inputs.inputs
        ]
        signature = ModelSignature(Schema(typed), signature.outputs, signature.params)
    return signature


def pip_requirements() -> list[str]:
    pins = []
    for name in REQUIREMENTS:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name).split('+')[0]}")
        except importlib.metadata.PackageNotFoundError:
            log.debug("%s is not installed here; not pinned for serving", name)
    return pins


def log_served_model(served: ServedModel, name: str) -> Any:
    """Log `served` as a pyfunc model into the active MLflow run; returns MLflow's ModelInfo."""
    example = served.input_example
    signature = serving_signature(example, predict(served.rebuilt, example), typed_inputs(served.rebuilt))
    with tempfile.TemporaryDirectory(prefix="retrain-task-modules-") as staging:
        return mlflow.pyfunc.log_model(
            name=name,
            # A file MLflow runs at load ("models from code"), not a pickled object.
            python_model=str(Path(__file__).with_name(MODEL_FROM_CODE_FILE)),
            artifacts={key: str(path) for key, path in served.artifact_paths(Path(staging)).items()},
            # The packages, so the model loads where this repository is not installed.
            code_paths=[str(Path(training.__file__).parent), str(Path(core.__file__).parent)],
            input_example=example,
            signature=signature,
            # Explicit requirements: inferring them would load and probe the model once more.
            pip_requirements=pip_requirements(),
            metadata=dict(served.metadata),
        )
