"""The models one front door serves: each model's name, the landing blobs that are its data, and what its
runs ask of the pipeline (task, task options, parameters)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from function_app.settings.storage import BlobScope

DEFAULT_TASK = "tabular"


@dataclass(frozen=True)
class ModelRoute:
    """One model: events in `scope` are its data (None: it takes no blob events, only drift alerts and
    HTTP requests); its runs train `task` with `task_options` and the pipeline `parameters`."""

    name: str
    scope: BlobScope | None = None
    task: str = DEFAULT_TASK
    task_options: Mapping[str, Any] = field(default_factory=dict)
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_options", MappingProxyType(dict(self.task_options)))
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))
