"""The task contract: everything that is specific to one model, and nothing else.

A *task* tells the engine how to turn raw files into a prepared data version, how to read that version as
three map-style data sets, how to build the model, what the loss of a batch is, how a model is scored, how
a registered model answers a user's request, and which features a drift check compares. The engine does
the rest, the same for every task: the loop, DDP, the global-index sampler and counter-based RNG (which make
resume bitwise exact), checkpoints, the eviction handshake, tracking, the gate, the registry and lineage.

The rules a task keeps, so that the engine's guarantees hold for it:

- **Map-style data.** Each split has `len()` and is indexed by the engine's global sample indices. Indexing
  with a 1-D `torch.long` tensor returns the whole batch at once (`TensorSplit` does this for data held in
  tensors; `ShardSplit`, training/data/shards.py, for data larger than memory: `prepare` writes each split
  with `split_shards`, `load` opens it with `open_split`, and a rank holds a bounded budget of it); a split
  that only takes `int` indices is batched by the engine with `default_collate`. A batch is a tensor, or a
  tuple/list/dict of tensors: the engine moves it to the device.
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
  `input_example` is such an input, which MLflow stores beside the model; its column types are the served
  signature's. A float column is served as whole numbers (MLflow `long`, what `pandas.read_csv` reads a
  column of whole numbers to) where the training data holds only whole numbers: the drift reference's
  feature of that name and the example's rows (training/gate/pyfunc_model.py `served_example`).
- **Drift features for every task.** `drift_features` turns a folder of raw files, or a prepared data version
  (the champion's training data), into one table of named numeric features the drift check compares;
  categorical columns and texts enter it as shares (training/tasks/features.py).

What a task may bring besides (optional; a task without it keeps the engine's default):

- **Its own optimisation.** `configure_optimization(model, settings)` returns `(optimizer, scheduler)`: a
  `torch.optim.Optimizer` over (some of) `model`'s parameters, and a `torch.optim.lr_scheduler.LRScheduler`
  of that optimizer or None (a constant learning rate). The engine calls it once per attempt, with the model
  on its device and before a checkpoint is loaded into them, so it must build the same objects every time
  (no randomness, no state of its own). The engine steps the scheduler once per optimizer step, that is once
  per global step (after all `--accumulate-grad-batches` micro-batches), and checkpoints and restores both
  objects' `state_dict()`s, which must hold only tensors and plain values. `settings` (`OptimizationSettings`)
  says how many optimizer steps the run takes and what `--learning-rate`, `--weight-decay` and
  `--warmup-steps` are: a task may follow them or not. Without the hook the engine uses AdamW
  (`--learning-rate`, `--weight-decay`) with a linear warm-up over `--warmup-steps` steps, then a cosine
  decay to a tenth of the learning rate at the last step. A scheduler that needs a metric to step
  (ReduceLROnPlateau) is refused: nothing gives it one each step.
- **Its FSDP units.** `fsdp_modules(model)` returns the submodules of `model` that `--strategy fsdp` shards
  as units of their own (a transformer's blocks, say), each gathered whole only for its own forward and
  backward; the root takes the rest. Without the hook, every submodule holding at least 100,000 parameters
  not already in a smaller unit is one (training/engine/strategy.py). It is called once per attempt, with
  the model on its device, before the optimizer is built.
- **The data's facts in the loss.** `loss(model, batch, info)`: a `loss` whose signature has a parameter
  named `info` is given the data version's `info` (class counts for a weighted loss, say) as `info=`; one
  with two parameters is called as `loss(model, batch)`.
- **Its class count, for per-class metrics.** A family declared `Metric("recall_*", ..., per_class=True)`
  has one member per class, `recall_<index>`. `class_count(raw)` says how many classes there are: from the
  task's options when they fix it (`raw` may be None), else from the raw files in `raw` as `prepare` would
  count them; None when it cannot say. The pre-run check asks it when a gate policy or an early-stopping
  metric names one member (`recall_7`), so that a class the data does not have is refused before anything
  trains, not by the gate after a whole training.
- **Untyped serving inputs.** `typed_inputs(info)` returning False registers the model without an input
  schema, so MLflow passes every input to `predict` as parsed (a CSV body as `pandas.read_csv` reads
  it): for inputs whose column types vary by file (a blank turns an int64 column to float64), which
  `predict` then checks itself. Without the hook, MLflow checks inputs against the example's types.

A task is loaded from `--task NAME` (a built-in: `tabular`, `image`), `--task path/to/file.py:Attr` or
`--task package.module:Attr` (training/tasks/loader.py). `Attr` is a `Task` instance, or a class or factory
called with the task's options (the `[task.options]` table of the model's configuration file).
"""

from __future__ import annotations

import inspect
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
    training/tasks/features.py builds both kinds in a line each. NaN in `values` is a missing value: the
    drift check compares a feature's present values and, beside them, its missing share as `NAME:missing`
    (training/drift/check.py); infinity is refused there."""

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
        raises `InputError` naming the file and what was expected, and writes nothing; raw files that do
        not fit (while others may) raise `RawFilesRejected`, each with its reason: the prepare step leaves
        them out and calls prepare again on the others (training/data/rejection.py)."""
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
        """A few inputs in the form a caller has (a DataFrame, a uint8 image array), for MLflow: a
        DataFrame's column types are what serving checks inputs against (int64: whole numbers)."""
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
# Methods a task may have (see the contract above); the engine does without them.
OPTIONAL_METHODS = ("configure_optimization", "fsdp_modules", "class_count", "typed_inputs")


@dataclass(frozen=True)
class OptimizationSettings:
    """What `configure_optimization` is told: the run's optimizer steps (all epochs, not per attempt), and
    the trainer's optimiser options, which a task's own optimisation may follow or not."""

    total_steps: int
    learning_rate: float
    weight_decay: float
    warmup_steps: int


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


def class_count_of(task: Task, raw: Path | None) -> int | None:
    """`task.class_count(raw)` when the task has a per-class metric family and the hook (None otherwise),
    refused in one line unless a whole number >= 1 or None."""
    hook = getattr(task, "class_count", None)
    if not task.metrics.per_class or not callable(hook):
        return None
    count = hook(raw)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise _broken(task, "class_count", repr(count), "a whole number >= 1, or None when it cannot say")
    return count


def loss_takes_info(task: Task) -> bool:
    """Whether `task.loss` takes the data's `info` (a parameter named `info`): asked once, at the trainer's
    start, so that every step calls it the one way."""
    try:
        return "info" in inspect.signature(task.loss).parameters
    except (TypeError, ValueError):  # a callable without a signature Python can read: the two-argument form
        return False


def batch_loss(
    task: Task, model: nn.Module, batch: Any, info: Mapping[str, Any] | None = None
) -> torch.Tensor:
    """`task.loss(model, batch)` (with `info=info` when given: a loss that takes it, `loss_takes_info`),
    refused in one line unless it is the batch's loss as one trainable number. Cheap enough for every step:
    it reads only the tensor's metadata, never its value (no device sync)."""
    loss = task.loss(model, batch) if info is None else task.loss(model, batch, info=info)  # type: ignore[call-arg]
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        must = "the batch's loss as one number: a 0-dim float tensor, e.g. the .mean() of per-sample losses"
        raise _broken(task, "loss", _described(loss), must)
    if not loss.requires_grad:
        got = f"{_described(loss)} without gradients"
        raise _broken(task, "loss", got, "a loss computed from the model's output, not detached from it")
    return loss


def configured_optimization(
    task: Task, model: nn.Module, settings: OptimizationSettings
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None] | None:
    """The task's `configure_optimization(model, settings)`, refused in one line unless it is an optimizer
    over `model`'s parameters and a step-wise scheduler of it (or None); None when the task has no hook."""
    hook = getattr(task, "configure_optimization", None)
    if hook is None:
        return None
    method, must = "configure_optimization", "(optimizer, scheduler or None)"
    result = hook(model, settings)
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise _broken(task, method, _described(result), f"a pair {must}")
    optimizer, scheduler = result
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise _broken(
            task,
            method,
            f"{_described(optimizer)} as its optimizer",
            f"{must}, a torch.optim.Optimizer first",
        )
    owned = {id(parameter) for parameter in model.parameters()}
    given = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    if not given or any(id(parameter) not in owned for parameter in given):
        got = (
            "an optimizer with no parameters" if not given else "an optimizer over parameters not the model's"
        )
        raise _broken(
            task, method, got, f"{must}, the optimizer over the parameters of the model it was given"
        )
    if scheduler is not None:
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        if plateau or not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
            got = "a ReduceLROnPlateau, which steps on a metric" if plateau else _described(scheduler)
            raise _broken(
                task, method, f"{got} as its scheduler", f"{must}, a step-wise torch LRScheduler second"
            )
        if scheduler.optimizer is not optimizer:
            raise _broken(
                task, method, "a scheduler of another optimizer", f"{must}, the scheduler of that optimizer"
            )
    return optimizer, scheduler
