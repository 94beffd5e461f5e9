"""The state of a training's newest valid checkpoint, read in this one process whatever its layout: what a
test inspects after a run (its weights, its optimizer state, its progress)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from training.checkpoint.checkpointer import Checkpointer, LoadedCheckpoint
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import CheckpointRecord
from training.checkpoint.sharded import ShardGroup


@dataclass(frozen=True)
class NewestState:
    record: CheckpointRecord
    # "model": the weights by parameter name; "optimizer": its tensors (a sharded checkpoint's by their
    # flattened names); the rest as the checkpoint holds it.
    state: dict[str, Any]


def newest_state(checkpoints: str | Path) -> NewestState | None:
    """The newest checkpoint in the folder that loads: a single file's state as saved; a sharded one's
    every tensor whole, on the CPU, resharded onto this one process."""
    checkpointer = Checkpointer(LocalCheckpointStore(Path(checkpoints)), shards=ShardGroup(0, 1))
    try:
        for candidate in checkpointer.resume_candidates():
            if isinstance(candidate, LoadedCheckpoint):
                return NewestState(candidate.record, candidate.state)
            return NewestState(candidate, _sharded_state(checkpointer, candidate))
        return None
    finally:
        checkpointer.close()


def _sharded_state(checkpointer: Checkpointer, record: CheckpointRecord) -> dict[str, Any]:
    metadata = checkpointer.sharded_metadata(record)
    model: dict[str, torch.Tensor] = {}
    target: dict[str, Any] = {"model": model, "run": b""}
    for fqn, entry in metadata.dcp.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            continue  # a pickled value: only the run's is read
        tensor = torch.empty(entry.size, dtype=entry.properties.dtype)
        if fqn.startswith("model."):
            model[fqn.removeprefix("model.")] = tensor
        else:
            target[fqn] = tensor  # its flattened name is its place in the checkpoint
    checkpointer.load_shards(record, metadata, target)
    run = torch.load(io.BytesIO(target.pop("run")), map_location="cpu", weights_only=True)
    optimizer = {key: value for key, value in target.items() if key.startswith("optimizer.")}
    return {**run, "model": model, "optimizer": optimizer}
