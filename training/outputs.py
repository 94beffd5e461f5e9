"""What a finished training leaves behind: the weights, their fingerprint, and metadata.json."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

MODEL_FILE = "model.pt"
METADATA_FILE = "metadata.json"
MODEL_FORMAT = "retrain-model/1"


def weights_sha256(model: nn.Module) -> str:
    """A hash of all parameter tensors' bytes, in sorted name order: equal weights, equal hash."""
    digest = hashlib.sha256()
    for _, parameter in sorted(model.named_parameters()):
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a file through a temporary sibling and a rename, so readers see all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_model(out_dir: Path, model: nn.Module, model_config: dict[str, Any]) -> Path:
    path = out_dir / MODEL_FILE
    payload = {"format": MODEL_FORMAT, "model_config": model_config, "state_dict": model.state_dict()}
    write_atomically(path, lambda handle: torch.save(payload, handle))
    return path


def write_metadata(out_dir: Path, metadata: dict[str, Any]) -> Path:
    path = out_dir / METADATA_FILE
    text = json.dumps(metadata, indent=2, sort_keys=True) + "\n"
    write_atomically(path, lambda handle: handle.write(text.encode()))
    return path


@torch.no_grad()
def classification_metrics(
    model: nn.Module, features: torch.Tensor, labels: torch.Tensor
) -> dict[str, float]:
    was_training = model.training
    model.eval()
    try:
        logits = model(features)
    finally:
        model.train(was_training)
    loss = nn.functional.cross_entropy(logits, labels).item()
    accuracy = (logits.argmax(dim=1) == labels).float().mean().item()
    return {"loss": loss, "accuracy": accuracy}
