"""The models one front door serves: each model's name, the landing blobs that are its data, and what its
runs ask of the pipeline (task, task options, parameters).

Every Blob-created event must belong to at most one model, so two served models' scopes may not overlap.
Two scopes overlap when they are in the same account (endpoint) and container, share a suffix, and one
prefix is the other's or a folder above it (the container's root is above every folder), whatever their
depths: a model whose raw files lie in sub-folders (the image task's class folders, depth 2) would take the
child's blobs as its own, and even at depth 1 the parent's data folder holds the child's files, so a
POST /api/retrain `data` folder or an Event Grid subscription filtered on the parent's prefix would mix the
two models' data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from types import MappingProxyType
from typing import Any

from function_app.settings.storage import BlobScope, SettingsError

DEFAULT_TASK = "tabular"


@dataclass(frozen=True)
class ModelRoute:
    """One model: events in `scope` are its data (None: it takes no blob events, only drift alerts and
    HTTP requests); its runs train `task` with `task_options` and the pipeline `parameters`. `config` is
    the configuration file it was read from (None: the RETRAIN_MODEL_NAME and RETRAIN_BLOB_* settings)."""

    name: str
    scope: BlobScope | None = None
    task: str = DEFAULT_TASK
    task_options: Mapping[str, Any] = field(default_factory=dict)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    config: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_options", MappingProxyType(dict(self.task_options)))
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))

    @property
    def source(self) -> str:
        """Where the model is configured, for messages: its file, or the settings that name it."""
        return str(self.config) if self.config is not None else "RETRAIN_MODEL_NAME and RETRAIN_BLOB_*"


def is_folder_at_or_above(upper: str, lower: str) -> bool:
    """Whether prefix `upper` is `lower` or a folder above it ('' is the container's root)."""
    return not upper or upper == lower or lower.startswith(f"{upper}/")


def scopes_overlap(first: BlobScope, second: BlobScope) -> bool:
    """Whether some blob, or some data folder, could belong to both scopes (see the module's rule)."""
    if (first.endpoint.url, first.container) != (second.endpoint.url, second.container):
        return False
    if not set(first.suffixes) & set(second.suffixes):
        return False
    return is_folder_at_or_above(first.prefix, second.prefix) or is_folder_at_or_above(
        second.prefix, first.prefix
    )


def check_served_models(models: Iterable[ModelRoute]) -> None:
    """Each name once, and no two scopes overlapping; raises `SettingsError` naming both models."""
    models = tuple(models)
    for first, second in combinations(models, 2):
        if first.name == second.name:
            raise SettingsError(
                f"model {first.name!r} is served twice ({first.source} and {second.source}); expected each "
                "model once"
            )
        if first.scope is not None and second.scope is not None and scopes_overlap(first.scope, second.scope):
            shared = ",".join(suffix for suffix in first.scope.suffixes if suffix in second.scope.suffixes)
            raise SettingsError(
                f"the blob scopes of models {first.name!r} ({first.source}: {first.scope.pattern}) and "
                f"{second.name!r} ({second.source}: {second.scope.pattern}) overlap on {shared}; expected "
                "disjoint scopes: another container, no shared suffix, or prefixes neither of which is the "
                "other or a folder above it"
            )
