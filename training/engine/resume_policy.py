"""Whether a checkpoint may be resumed under the current options: torch-free, so that the launcher can
refuse an incompatible resume in one line before it starts any worker, and every worker applies the same
rule."""

from __future__ import annotations

from core.errors import ResumeRefusedError
from training.checkpoint.records import CheckpointRecord
from training.engine.config import TrainConfig, trajectory_mismatches


def check_resumable(record: CheckpointRecord, config: TrainConfig, data_version: str) -> None:
    """Refuse a resume that would silently change the run; the message says how to proceed."""
    mismatches = trajectory_mismatches(record.trajectory, config)
    if mismatches:
        raise ResumeRefusedError(
            f"checkpoint {record.name} was made with other training options: {'; '.join(mismatches)}; use "
            "the checkpoint's values, or a new --checkpoints location to start over"
        )
    if record.data_version != data_version and not config.allow_data_change:
        raise ResumeRefusedError(
            f"checkpoint {record.name} was trained on data {record.data_version}, but --data is "
            f"{data_version}; pass the same data, or --allow-data-change to continue training on the new data"
        )
