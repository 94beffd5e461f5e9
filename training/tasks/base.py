"""The task contract: everything that is specific to one model, and nothing else.

A *task* tells the engine how to turn raw files into a prepared data version, how to read that version as
three map-style data sets, how to build the model, what the loss of a batch is, how a model is scored, how
a registered model answers a user's request, and which features a drift check compares. The engine does
the rest, the same for every task: the loop, DDP, the global-index sampler and counter-based RNG (which make
resume bitwise exact), checkpoints, the eviction handshake, tracking, the gate, the registry and lineage.

The rules a task keeps, so that the engine's guarantees hold for it:

- **Map-style data.** Each split has `len()` and is indexed by the engine's global sample indices. Indexing
  with a 1-D `torch.long` tensor returns the whole batch at once (`TensorSplit` does this for data held in
  tensors); a split that only takes `int` indices is batched by the engine with `default_collate`. A batch is
  a tensor, or a tuple/list/dict of tensors: the engine moves it to the device.
- **No randomness of its own.** Dropout and augmentation use torch's default generator, which the engine
  reseeds before every step from (seed, step, rank); a task never seeds, never keeps a generator and never
  touches checkpoint or distributed code. A resumed run then ends with the same weights as an uninterrupted
  one.
- **Rebuildable models.** `build_model(info)` builds the same architecture from the `info` its `load`
  returned (plain JSON values), so a model file holds only that `info` and a state dict, and evaluation,
  registration and serving rebuild it without the data.
- **Metrics with a direction.** `metrics` lists every metric `score` returns, each higher- or
  lower-is-better; a name ending in `*` covers a family (`recall_*`). The gate reads the directions from here,
  and a gate policy naming a metric the task does not declare is refused before any step runs.
- **Serving what users have.** `predict` takes what a caller naturally holds (a pandas DataFrame read
  straight from a raw CSV, a uint8 N×H×W×3 image array) and returns an answer they can use (class names);
  `input_example` is such an input, which MLflow stores beside the model.
- **Drift features for every task.** `drift_features` turns a folder of raw files, or a prepared data version
  (the champion's training data), into one table of named numeric features the drift check compares;
  categorical columns and texts enter it as shares (training/tasks/features.py).

A task is loaded from `--task NAME` (a built-in: `tabular`, `image`), `--task path/to/file.py:Attr` or
`--task package.module:Attr` (training/tasks/loader.py). `Attr` is a `Task` instance, or a class or factory
called with the task's options (the `[task.options]` table of the model's configuration file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from core.errors import InputError

# The contract's metric types, re-exported: they live torch-free (core/metrics.py), where the front door
# reads the built-in tasks' declarations too.
from core.metrics import DIRECTIONS as DIRECTIONS
from core.metrics import Direction as Direction
from core.metrics import Metric as Metric
from core.metrics import MetricSet
from training.data.splits import SPLIT_NAMES, SplitFractions
from training.data.token_shares import TokenGroup


@dataclass(frozen=True)
class FeatureTable:
    """Named numeric features, one row per item: what a drift check compares. `groups` holds non-numeric
    inputs (a categorical column, a text) as each row's tokens; the drift check turns them into share
    columns by the reference's vocabulary (training/data/token_shares.py), the same columns on both sides.
    training/tasks/features.py builds both kinds in a line each."""

    names: tuple[str, ...]
    values: np.ndarray  # float64 [rows, len(names)]
    groups: tuple[TokenGroup, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(self.names))
        object.__setattr__(self, "groups", tuple(self.groups))
        values = np.asarray(self.values, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != len(self.names):
            raise InputError(
                f"drift features: expected a [rows, {len(self.names)}] array for {len(self.names)} names, "
                f"got shape {values.shape}"
            )
        for group in self.groups:
            if len(group.rows) != values.shape[0]:
                raise InputError(
                    f"drift features {group.name}: {len(group.rows)} rows of tokens beside {values.shape[0]} "
                    "rows of numbers; expected one per item"
                )
        named = [*self.names, *(group.name for group in self.groups)]
        if len(set(named)) != len(named):
            twice = sorted({name for name in named if named.count(name) > 1})
            raise InputError(f"drift features: {twice[:5]} named twice; expected each feature once")
        object.__setattr__(self, "values", values)

    def __len__(self) -> int:
        return int(self.values.shape[0])


@dataclass(frozen=True)
class TaskData:
    """A prepared data version, loaded: three map-style splits and the facts a model is built from.

    `info` is JSON-ready (numbers, strings, lists, dicts) and holds what `build_model` needs besides the
    task's options: feature counts, class names, normalisation statistics, an image size.
    """

    data_version: str
    splits: Mapping[str, Any]
    info: Mapping[str, Any] = field(default_factory=dict)

    def split(self, name: str) -> Any:
        if name not in self.splits:
            raise InputError(f"no split named {name!r}; expected one of {', '.join(SPLIT_NAMES)}")
        return self.splits[name]


class TensorSplit:
    """A map-style split held in tensors: `split[indices]` returns the batch `(inputs[idx], targets[idx])`.

    Indexing with one tensor of indices is one gather per tensor, not a Python loop: this is the fast path
    the engine uses for every task whose split fits in memory.
    """

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, keys: Sequence[str] = ()) -> None:
        if len(inputs) != len(targets):
            raise InputError(f"a split needs one target per input; got {len(inputs)} and {len(targets)}")
        self.inputs = inputs
        self.targets = targets
        self.keys = list(keys)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


@runtime_checkable
class Task(Protocol):
    """What a model brings. Attributes and methods, in the order a retraining uses them."""

    name: str
    """A short name for logs, tags and the model file (`tabular`, `image`, `house-prices`)."""

    raw_suffixes: tuple[str, ...]
    """File suffixes that count as raw data (`.csv`, `.png`): what prepare reads and the front door routes."""

    metrics: MetricSet
    """Every metric `score` returns, each with its direction; the gate reads them from here."""

    default_primary_metric: str
    """The metric the gate compares with the champion unless the model's configuration names another."""

    def options(self) -> Mapping[str, Any]:
        """The options this task was built with (JSON-ready): recorded in checkpoints, models and lineage;
        a checkpoint resumes only under the same options."""
        ...

    def prepare(self, raw: Path, out: Path, *, previous: Path | None, split: SplitFractions) -> str:
        """Raw files in `raw` -> a prepared data version written into `out` (new or empty); returns its
        content-derived version. With `previous`, unchanged raw files are not decoded again. Bad input
        raises `InputError` naming the file and what was expected, and writes nothing."""
        ...

    def load(self, data_dir: Path) -> TaskData:
        """A prepared data version, checked against its manifest, as map-style splits."""
        ...

    def build_model(self, info: Mapping[str, Any]) -> nn.Module:
        """The model for data described by `info` (from `load`); initial weights come from torch's
        default generator, which the engine has seeded."""
        ...

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The scalar loss of one batch (as the split returned it, on the device); `model` may be
        wrapped in DistributedDataParallel, so call it, do not reach into it."""
        ...

    def score(self, model: nn.Module, split: Any) -> dict[str, float]:
        """Every declared metric of `model` on a whole split. The engine has put `model` in eval mode and
        disabled gradients."""
        ...

    def input_example(self, data: TaskData) -> Any:
        """A few inputs in the form a caller has (a DataFrame, a uint8 image array), for MLflow."""
        ...

    def predict(self, model: nn.Module, info: Mapping[str, Any], inputs: Any) -> Any:
        """Serving: what a caller has in, answers they can use out (e.g. class names). `model` is in eval
        mode on the CPU, gradients disabled."""
        ...

    def drift_features(self, source: Path, *, prepared: bool) -> FeatureTable:
        """Features the drift check compares: of a folder of raw files (`prepared=False`, the newly
        arrived data) or of a prepared data version's train split (`prepared=True`, the reference)."""
        ...


REQUIRED_METHODS = (
    "options",
    "prepare",
    "load",
    "build_model",
    "loss",
    "score",
    "input_example",
    "predict",
    "drift_features",
)
REQUIRED_ATTRIBUTES = ("name", "raw_suffixes", "metrics", "default_primary_metric")


def missing_parts(task: object) -> list[str]:
    """What `task` lacks of the contract: attribute and method names, empty when it is complete."""
    missing = [name for name in REQUIRED_ATTRIBUTES if not hasattr(task, name)]
    missing += [f"{name}()" for name in REQUIRED_METHODS if not callable(getattr(task, name, None))]
    if not missing and not isinstance(getattr(task, "metrics", None), MetricSet):
        missing.append("metrics (a MetricSet)")
    if not missing and task.metrics.find(task.default_primary_metric) is None:
        missing.append(f"default_primary_metric {task.default_primary_metric!r} among its metrics")
    return missing


class TaskContractError(InputError):
    """A task's method returned what the contract above does not allow: a bug in the task, named by its
    method and what that method must return, instead of whatever failed with it later."""


def _described(value: object) -> str:
    if isinstance(value, torch.Tensor):
        shape = "a 0-dim" if value.dim() == 0 else f"a shape {list(value.shape)}"
        return f"{shape} {str(value.dtype).removeprefix('torch.')} tensor"
    return f"a {type(value).__name__}"


def _broken(task: object, method: str, got: str, must: str) -> TaskContractError:
    name = getattr(task, "name", type(task).__name__)
    return TaskContractError(
        f"task {name!r}: {method}() returned {got}; it must return {must} (training/tasks/base.py)"
    )


def built_model(task: Task, info: Mapping[str, Any]) -> nn.Module:
    """`task.build_model(info)`, refused in one line unless it is a torch.nn.Module."""
    model = task.build_model(info)
    if not isinstance(model, nn.Module):
        raise _broken(task, "build_model", _described(model), "a torch.nn.Module (the model itself)")
    return model


def batch_loss(task: Task, model: nn.Module, batch: Any) -> torch.Tensor:
    """`task.loss(model, batch)`, refused in one line unless it is the batch's loss as one trainable number.
    Cheap enough for every step: it reads only the tensor's metadata, never its value (no device sync)."""
    loss = task.loss(model, batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        must = "the batch's loss as one number: a 0-dim float tensor, e.g. the .mean() of per-sample losses"
        raise _broken(task, "loss", _described(loss), must)
    if not loss.requires_grad:
        got = f"{_described(loss)} without gradients"
        raise _broken(task, "loss", got, "a loss computed from the model's output, not detached from it")
    return loss
