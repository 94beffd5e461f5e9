"""A user's task and its gate policy, checked before a flush records or spends anything.

A built-in task's policy is checked at start-up (function_app/settings/gates.py). A user's task file needs
torch to import, which the front door never does: where runs train on this machine (the local submitter),
the flush asks the preflight (`python -m training.cli check-model`, components/preflight.py) before it
writes a submission or counts one in the day's budget (the early-stopping metric too, and a class's recall
against the class count the task's options fix), and the verdict is kept per version of the file,
or of a module task's sources (`RecordedPreflight`), so a version is checked once, not at every flush. A
refusal holds the batch: its claims stay pending with the reason, and go once the file is fixed. On Azure
ML the Function App has no torch and no training code: the pipeline's first step checks the policy before
it prepares any data.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from components.errors import SubmissionError
from components.preflight import STOPPING_METRIC, Preflight, RecordedPreflight, SubprocessPreflight
from components.run_inputs import GATE_INPUTS
from components.run_settings import RunSettings
from components.specs import REPO_ROOT
from components.task_ref import BUILTIN_RAW_SUFFIXES, parse_task_reference, task_code
from function_app.settings.models import ModelRoute

VERDICTS_FOLDER = "preflight"  # under RETRAIN_HOME: the kept verdicts on user task files


class TaskCheck(Protocol):
    def refusal(self, route: ModelRoute, parameters: Mapping[str, Any]) -> str | None:
        """Why `route`'s runs with these pipeline `parameters` must not start (one line), or None."""
        ...


class NoTaskCheck:
    """Where nothing here can load a user's task: Azure ML checks it in the pipeline's first step, and a dry
    run trains nothing."""

    def refusal(self, route: ModelRoute, parameters: Mapping[str, Any]) -> str | None:
        return None


class PreflightTaskCheck:
    """Checks a user's task and its gate policy with the preflight, as the run would be checked."""

    def __init__(self, preflight: Preflight, search_path: Sequence[str] = ()) -> None:
        self.preflight = preflight
        self.search_path = list(search_path)  # where the check finds a module task: as the steps do

    @classmethod
    def kept_in(cls, home: Path, environ: Mapping[str, str]) -> PreflightTaskCheck:
        """The check the local submitter's runs get: this interpreter, the steps' code, verdicts kept in
        `<home>/preflight/`; a module task is looked for where the steps look (the code folder, their
        PYTHONPATH, this interpreter's path), so its verdict is kept per version of its sources too."""
        extra = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
        search_path = [str(REPO_ROOT), *extra, *(entry for entry in sys.path if entry)]
        preflight = RecordedPreflight(SubprocessPreflight(environ=environ), Path(home) / VERDICTS_FOLDER)
        return cls(preflight, search_path)

    def refusal(self, route: ModelRoute, parameters: Mapping[str, Any]) -> str | None:
        if route.task in BUILTIN_RAW_SUFFIXES:
            return None  # its metrics are static: checked at start-up
        # The gate's inputs and the early-stopping metric: what names the task's metrics.
        named = {*GATE_INPUTS, STOPPING_METRIC}
        gate = {name: value for name, value in parameters.items() if name in named}
        try:
            # The code's hash keys the kept verdict: a task file's sha256, a module task's sources'.
            code = task_code(parse_task_reference(route.task, None, "task"), self.search_path)
            run = RunSettings(
                model_name=route.name,
                task=route.task,
                task_options=route.task_options,
                parameters=gate,
                where=f"{route.source} [gate]",
                task_sha256=None if code is None or not code.sha256 else code.sha256,
            )
            self.preflight.check(run, run.where)
        except SubmissionError as error:  # refused, a task file gone, or a check that could not run
            return str(error)
        return None
