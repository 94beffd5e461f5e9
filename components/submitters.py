"""The one registry of submitters: RETRAIN_SUBMITTER's name picks the twin that runs a request, as MLflow
picks a tracking store by its URI's scheme.

    local     components/local/submitter.py     the pipeline's steps as processes on this machine
    azureml   components/azureml/submitter.py   a pipeline job in an Azure ML workspace
    dry-run   components/azureml/dry_run.py     the job `azureml` would submit, built and recorded, not sent

Each implementation's module is imported only when its name is chosen, and each exposes one builder,
`build_submitter(SubmitterContext) -> Submitter`. So neither this contract nor the deployed front door
imports components/local/, which the Function App does not ship (.funcignore): choosing `local` there is
one line saying so and what to set instead, as is a name no submitter has.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.errors import SubmitterUnavailable
from core.text import quoted

if TYPE_CHECKING:
    from components.preflight import Preflight
    from components.request import Submitter

SUBMITTER_SETTING = "RETRAIN_SUBMITTER"
LOCAL, AZUREML, DRY_RUN = "local", "azureml", "dry-run"
# Where each submitter is built: `module:function`, imported when chosen. The first is the default.
_BUILDERS = {
    LOCAL: "components.local.submitter:build_submitter",
    AZUREML: "components.azureml.submitter:build_submitter",
    DRY_RUN: "components.azureml.dry_run:build_submitter",
}
SUBMITTERS = tuple(_BUILDERS)


@dataclass(frozen=True)
class SubmitterContext:
    """What any submitter is built from; each takes what it needs and ignores the rest."""

    home: Path  # the state folder: local runs and their cache, dry-run records, staged code snapshots
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold credentials
    # The Azure ML datastore of the pipeline's checkpoints and registry lock; None: workspaceblobstore.
    datastore: str | None = None
    # Jobs run the components `retrain publish` registered, as the deployed app (which carries no training
    # code) must; False: each job uploads this checkout's code.
    registered_components: bool = True
    # The caller's task check, when it has checked the task already (the front door's flush): the local
    # runner then checks each run as the caller did, with the same kept verdicts.
    preflight: Preflight | None = None
    # The Azure ML workspace seam (components/azureml/workspace.py) to submit through, where the caller
    # shares it (the front door registers data assets through the same one); None: opened from `environ`.
    workspace: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.home, Path):
            raise TypeError(f"SubmitterContext home {self.home!r}: expected a pathlib.Path; pass Path(home)")


def check_submitter(name: str) -> str:
    """`name` if a submitter has it and this installation ships it; else one line naming the setting and
    what to set instead."""
    if name not in _BUILDERS:
        known = ", ".join(SUBMITTERS)
        raise SubmitterUnavailable(f"{SUBMITTER_SETTING} {quoted(name)}: expected one of {known}")
    if not _ships(name):
        folder = _package(name).replace(".", "/")
        shipped = ", ".join(other for other in SUBMITTERS if _ships(other))
        raise SubmitterUnavailable(
            f"{SUBMITTER_SETTING}={name}: this installation does not ship {folder}/ (the deployed Function "
            f"App leaves it out, .funcignore); set {SUBMITTER_SETTING} to one of {shipped}"
        )
    return name


def open_submitter(name: str, context: SubmitterContext) -> Submitter:
    """The submitter called `name`, built from `context`; its module is imported now, and only its."""
    module, _, function = _BUILDERS[check_submitter(name)].partition(":")
    built: Submitter = getattr(importlib.import_module(module), function)(context)
    return built


def _package(name: str) -> str:
    return _BUILDERS[name].partition(":")[0].rpartition(".")[0]


def _ships(name: str) -> bool:
    """Whether the package of submitter `name` is here, found without importing it."""
    return importlib.util.find_spec(_package(name)) is not None
