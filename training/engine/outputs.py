"""What a finished training leaves behind: the weights, their fingerprint, and metadata.json.

model.pt (format `retrain-model/2`) holds what rebuilds the model without the data: the task reference
and options, the task's `info` (from `Task.load`) and the state dict. `load_model_file` is the one way
back from such a file to a model, for evaluation, registration and serving alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from core.errors import InputError
from core.files import write_atomically
from core.task_ref import written_options
from training.tasks.base import built_model

if TYPE_CHECKING:
    from training.tasks.base import Task

MODEL_FILE = "model.pt"
METADATA_FILE = "metadata.json"
MODEL_FORMAT = "retrain-model/2"
PAYLOAD_KEYS = ("format", "task", "task_options", "info", "state_dict")


def weights_sha256(model: nn.Module) -> str:
    """A hash of all parameter tensors' bytes, in sorted name order: equal weights, equal hash."""
    digest = hashlib.sha256()
    for _, parameter in sorted(model.named_parameters()):
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def write_model(
    out_dir: Path,
    model: nn.Module,
    task_ref: str,
    task_options: Mapping[str, Any],
    info: Mapping[str, Any],
) -> Path:
    """model.pt in `out_dir`: everything `load_model_file` needs to rebuild `model` (a task secret as
    `***`, which the loader gives its value from the environment of whoever rebuilds it)."""
    path = out_dir / MODEL_FILE
    payload = {
        "format": MODEL_FORMAT,
        "task": task_ref,
        "task_options": written_options(task_options),
        "info": dict(info),
        "state_dict": model.state_dict(),
    }
    write_atomically(path, lambda handle: torch.save(payload, handle))
    return path


def read_model_payload(path: Path) -> dict[str, Any]:
    """The checked contents of a model.pt (`path` is the file or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    expected = f"a {MODEL_FORMAT} model.pt written by `retrain train`"
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; expected {expected}") from None
    except Exception as error:  # a truncated or foreign file: torch raises many kinds
        raise InputError(f"{path}: not readable ({type(error).__name__}); expected {expected}") from None
    if not isinstance(payload, dict) or payload.get("format") != MODEL_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise InputError(f"{path}: format {found!r}; expected {expected} (retrain the model)")
    missing = [key for key in PAYLOAD_KEYS if key not in payload]
    if missing:
        raise InputError(f"{path}: lacks {', '.join(missing)}; expected {expected}")
    return payload


def load_model_file(
    path: Path, *, task: Task | None = None, cwd: Path | None = None
) -> tuple[Task, nn.Module, dict[str, Any]]:
    """Rebuild a trained model from model.pt (or the folder holding it): (task, model, payload).

    The task is loaded from the recorded reference and options (a file reference relative to `cwd`),
    unless `task` is given (serving, where the task file travels with the model). The model comes back
    in eval mode on the CPU."""
    from training.tasks.loader import load_task

    payload = read_model_payload(path)
    if task is None:
        task = load_task(str(payload["task"]), payload["task_options"], cwd=cwd)
    model = built_model(task, payload["info"])
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0]
        raise InputError(
            f"{path}: its weights do not fit the model task {payload['task']!r} builds ({first}); "
            "load it with the task and options it was trained with"
        ) from None
    model.eval()
    return task, model, payload


def scores(task: Task, model: nn.Module, split: Any) -> dict[str, float]:
    """`task.score` with the model in eval mode and gradients off (mode restored), as plain floats (what
    JSON, MLflow and the gate take); a score that is not a number is refused naming the task."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            scores = task.score(model, split)
    finally:
        model.train(was_training)
    if not isinstance(scores, Mapping):
        raise InputError(f"task {task.name!r}: score() returned {type(scores).__name__}; expected a dict")
    metrics = {}
    for name, value in scores.items():
        try:
            metrics[str(name)] = float(value)
        except (TypeError, ValueError):
            raise InputError(
                f"task {task.name!r}: score() gave {name!r} = {value!r}; expected a number"
            ) from None
    return metrics


def write_metadata(out_dir: Path, metadata: dict[str, Any]) -> Path:
    path = out_dir / METADATA_FILE
    text = json.dumps(metadata, indent=2, sort_keys=True) + "\n"
    write_atomically(path, lambda handle: handle.write(text.encode()))
    return path
