"""The size of a checkpoint before one exists, and the launcher's room check built on it.

Before the first step the checkpoint location must have room for the checkpoints the run keeps
(training/checkpoint/free_space.py). Resuming, the newest checkpoint's size says how big one is; on a fresh
start it is estimated from the model and its optimizer. With `--nproc` above 1 the launcher checks before
torchrun starts, so that a refusal is one line without torchrun's report; rank 0 checks again, on the storage
it will write (training/checkpoint/manager.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from training.checkpoint.free_space import check_room
from training.checkpoint.open_store import newest_record, open_checkpoint_store
from training.tasks.base import TaskContractError, built_model

if TYPE_CHECKING:
    from training.engine.config import TrainConfig
    from training.tasks.base import Task

# Optimizer state tensors kept per trainable parameter, each the parameter's size: Adam and AdamW keep two
# moments (their `step` is a scalar, within the overhead below). The engine builds AdamW; an optimizer not
# listed is assumed to keep two, erring on the side of room.
STATE_TENSORS_PER_PARAMETER = {"Adam": 2, "AdamW": 2, "SGD": 1, "RMSprop": 1, "Adagrad": 1}
# What a checkpoint holds besides tensor bytes: per tensor a zip entry (headers, 64-byte alignment) and its
# pickled reference; once, the scheduler, progress, config and attempt history. The small tabular model's
# checkpoint (18 tensors) carries about 9 KB of it, so these err well on the side of room.
PER_TENSOR_OVERHEAD_BYTES = 1024
FIXED_OVERHEAD_BYTES = 64 * 1024

ESTIMATE_BASIS = "estimated from the model and its optimizer"


def estimate_checkpoint_bytes(model: nn.Module, optimizer: str = "AdamW", best_copy: bool = False) -> int:
    """The size of a checkpoint of `model` trained with `optimizer` (a class name), before one exists.

    Parameters and buffers once (twice with `best_copy`: a validating run's checkpoints also hold its best
    validated weights), plus the optimizer's state tensors for every trainable parameter, plus overhead.
    Works on a model built on the meta device, which holds no memory.
    """
    states = STATE_TENSORS_PER_PARAMETER.get(optimizer, 2)
    parameters = list(model.parameters())
    buffers = list(model.buffers())
    trainable = [parameter for parameter in parameters if parameter.requires_grad]
    tensor_bytes = sum(tensor.numel() * tensor.element_size() for tensor in [*parameters, *buffers])
    state_bytes = states * sum(parameter.numel() * parameter.element_size() for parameter in trainable)
    tensors = len(parameters) + len(buffers) + states * len(trainable)
    if best_copy:
        tensor_bytes, tensors = 2 * tensor_bytes, tensors + len(parameters) + len(buffers)
    return tensor_bytes + state_bytes + tensors * PER_TENSOR_OVERHEAD_BYTES + FIXED_OVERHEAD_BYTES


def _model_for_estimate(task: Task, info: Mapping[str, Any]) -> nn.Module:
    # On the meta device a model has shapes and dtypes but no memory and no initialisation to compute, so the
    # launcher stays small beside the workers it starts. A model that cannot be built there is built for real.
    try:
        with torch.device("meta"):
            return built_model(task, info)
    except TaskContractError:
        raise
    except Exception:
        return built_model(task, info)


def refuse_unfit_checkpoint_location(config: TrainConfig, environ: Mapping[str, str], task: Task) -> None:
    """The launcher's room check (`--nproc` > 1), before torchrun starts: one line instead of a refusal in
    every worker and torchrun's report of it. Resuming, the newest record gives the size; on a fresh start
    the launcher reads the data's `info` and builds the model on the meta device for the estimate."""
    store = open_checkpoint_store(config.checkpoints, environ)
    record = newest_record(store)
    if record is not None:
        check_room(store, record.size, f"the size of {record.name}", config.keep_checkpoints)
        return
    model = _model_for_estimate(task, task.load(config.data).info)
    size = estimate_checkpoint_bytes(model, best_copy=config.validates)
    check_room(store, size, ESTIMATE_BASIS, config.keep_checkpoints)
