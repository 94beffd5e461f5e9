"""The built-in tabular task with every split held in memory: the baseline bench/data_scale.py trains
against, the path the task took before it trained from shards (training/data/shards.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from training.tasks.base import TaskData, TensorSplit
from training.tasks.tabular.task import TabularTask


class InMemoryTabular(TabularTask):
    def load(self, data_dir: Path) -> TaskData:
        data = super().load(data_dir)
        held = {name: TensorSplit(*split[torch.arange(len(split))]) for name, split in data.splits.items()}
        return TaskData(data_version=data.data_version, splits=held, info=data.info)
