"""Staging folders a killed run left in the step cache, removed once nothing owns them.

A step writes its outputs into `<cache>/<step>/.staging-<run_id>-<hex>/` (cache.py), which its run renames
into place or deletes. A run whose runner was killed (SIGKILL, a lost machine) does neither, and the folder
stays. It may be removed only when no process can still write it: its run is no longer in progress (a run
whose runner has ended reads as Abandoned, runs.py), and no process of that run is left (a step outlives a
runner killed alone; every process of a step carries its run's id in RETRAIN_PIPELINE_RUN). A folder whose
run has no record (a run killed between making the folder and saving its record cannot be: the record comes
first) is left alone, as is one whose run is on another host.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from components.errors import PipelineError
from components.local.cache import STAGING_PREFIX
from components.local.liveness import processes_with_environment
from components.local.runs import IN_PROGRESS, RunStore

log = logging.getLogger(__name__)

RUN_VARIABLE = "RETRAIN_PIPELINE_RUN"  # set for every step's processes (launch.step_environment)
_RUN_ID_CHARS = len("YYYYmmdd-HHMMSS-abcdef")


def owner_run(folder: Path) -> str | None:
    """The run id a staging folder's name carries; None for a name that is not a staging folder's."""
    if not folder.name.startswith(STAGING_PREFIX):
        return None
    return folder.name[len(STAGING_PREFIX) :][:_RUN_ID_CHARS] or None


def sweep_staging(cache_root: Path, runs: RunStore) -> list[Path]:
    """Remove every staging folder under `cache_root` that no run or process owns any more; the removed."""
    removed = []
    for folder in sorted(cache_root.glob(f"*/{STAGING_PREFIX}*")):
        run_id = owner_run(folder)
        if run_id is None or not folder.is_dir() or _owned(run_id, runs):
            continue
        if _remove(folder):
            removed.append(folder)
            log.info("removed %s, left by run %s, which has ended", folder, run_id)
    return removed


def _owned(run_id: str, runs: RunStore) -> bool:
    try:
        record = runs.load(run_id)  # a run whose runner has ended reads (and is recorded) as Abandoned
    except PipelineError:
        return True  # no readable record: nothing tells that it has ended
    if record.status in IN_PROGRESS:
        return True  # running, or its runner is on another host
    return bool(processes_with_environment(RUN_VARIABLE, run_id))


def _remove(folder: Path) -> bool:
    try:
        shutil.rmtree(folder)
    except OSError as error:
        log.warning("cannot remove %s, left by an ended run: %s", folder, error.strerror or error)
        return False
    return True
