"""What a training run leaves behind, read back: its newest committed checkpoint's record, its metadata."""

from __future__ import annotations

import json
from pathlib import Path

from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import RECORD_SUFFIX, CheckpointRecord, committed_checkpoints


def newest_record(checkpoints: str) -> CheckpointRecord:
    store = LocalCheckpointStore(Path(checkpoints))
    name = committed_checkpoints(store.names())[0]
    return CheckpointRecord.from_bytes(store.read(name + RECORD_SUFFIX), name)


def read_metadata(out: Path) -> dict:
    return json.loads((out / "metadata.json").read_text())
