"""What a finished training leaves behind: the weights, their fingerprint, and metadata.json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.common import write_atomically

MODEL_FILE = "model.pt"
METADATA_FILE = "metadata.json"
MODEL_FORMAT = "retrain-model/1"


def weights_sha256(model: nn.Module) -> str:
    """A hash of all parameter tensors' bytes, in sorted name order: equal weights, equal hash."""
    digest = hashlib.sha256()
    for _, parameter in sorted(model.named_parameters()):
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


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
