"""A user's task that works in float64: the regression task (regression_task.py) with its data and its
model in double precision, as a user whose numbers need it writes it. Loaded by module reference
(`--task helpers.training.float64_task:Float64Regression`), as a user's package task is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from helpers.training.regression_task import RegressionTask
from training.tasks.base import TaskData, TensorSplit


class Float64Regression(RegressionTask):
    name = "linear-regression-float64"

    def load(self, data_dir: Path) -> TaskData:
        data = super().load(data_dir)
        splits = {
            name: TensorSplit(split.inputs.double(), split.targets.double())
            for name, split in data.splits.items()
        }
        return TaskData(data.data_version, splits, data.info)

    def build_model(self, info: Mapping[str, Any]) -> nn.Module:
        return super().build_model(info).double()

    def predict(self, model: nn.Module, info: Mapping[str, Any], inputs: Any) -> Any:
        frame = inputs if isinstance(inputs, pd.DataFrame) else pd.DataFrame(inputs, columns=self.columns)
        x = torch.tensor(frame[self.columns].to_numpy(dtype=np.float64))
        return model(x).squeeze(-1).detach().numpy()
