"""Retention of the pinned raw data versions of a state root, and collection of the bytes none of them holds.

Every batch pins its data under `<state>/data/<model>/<version>/`, hard links into `<state>/data/.objects/`
(components/data_version.py): a version costs only its new files, but every version ever pinned keeps its
files' objects alive. `retrain gc` removes the versions nothing needs any more, then every object that no
remaining version links (core/objects.py). A version stays when

- it is among its model's `keep` newest pins (by when it was last pinned or reused), or
- a caller names it as in use: the front door's unfinished submissions and each model's last finished one,
  whose files the next batch is built on; a local run in progress; a registered model version, whose
  lineage names the data it was trained on (`retrain lineage` must still find that data).

Removing a version takes its manifest first, so that a removal cut short leaves an incomplete pin (which
the next pin of that data redoes), never a version that says it is whole and is not. Removal holds the
object store exclusively: no pin is between finding a version or an object and linking it meanwhile.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from components.data_version import OBJECTS_FOLDER, pinned_contents_file, pinned_manifest_file
from components.errors import PipelineError
from core.names import is_model_name
from core.objects import Collected, ObjectStore
from core.versions import MANIFEST_SUFFIX, is_raw_version

log = logging.getLogger(__name__)

DEFAULT_KEEP = 3

# model -> {raw version: why it is in use}
InUse = Mapping[str, Mapping[str, str]]


@dataclass(frozen=True)
class PinnedVersion:
    model_name: str
    version: str
    folder: Path
    pinned_at: float  # when its manifest was last written or its pin reused (seconds since the epoch)

    def describe(self) -> str:
        when = datetime.fromtimestamp(self.pinned_at, UTC).isoformat(timespec="seconds")
        return f"{self.model_name} {self.version} (pinned {when})"


@dataclass(frozen=True)
class Collection:
    """What one collection did: the versions it removed, those it kept and why, and the objects freed."""

    removed: tuple[PinnedVersion, ...]
    kept: tuple[tuple[PinnedVersion, str], ...]
    objects: Collected


def pinned_versions(data_root: Path) -> list[PinnedVersion]:
    """The complete pins under `data_root` (a version folder with its manifest beside it), newest first."""
    found = []
    for model_folder in sorted(Path(data_root).iterdir()) if Path(data_root).is_dir() else ():
        if not model_folder.is_dir() or not is_model_name(model_folder.name):
            continue  # the object store, a stray file
        for manifest in model_folder.glob(f"*{MANIFEST_SUFFIX}"):
            version = manifest.name.removesuffix(MANIFEST_SUFFIX)
            folder = model_folder / version
            if is_raw_version(version) and folder.is_dir():
                found.append(PinnedVersion(model_folder.name, version, folder, manifest.stat().st_mtime))
    return sorted(found, key=lambda pinned: (pinned.pinned_at, pinned.version), reverse=True)


def collect(data_root: Path, in_use: InUse, keep: int = DEFAULT_KEEP, dry_run: bool = False) -> Collection:
    """Remove the pinned versions under `data_root` that are neither among their model's `keep` newest nor
    named in `in_use`, then the objects no version links any more; with `dry_run`, only say which."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise PipelineError(
            f"--keep {keep!r}: expected a whole number of at least 1 (the newest pin of each model is what "
            "its next run builds on)"
        )
    objects = ObjectStore(Path(data_root) / OBJECTS_FOLDER)
    with objects.exclusively():
        removed, kept = [], []
        newest: dict[str, int] = {}
        for pinned in pinned_versions(data_root):
            rank = newest[pinned.model_name] = newest.get(pinned.model_name, 0) + 1
            why = in_use.get(pinned.model_name, {}).get(pinned.version)
            if why is None and rank <= keep:
                why = f"among the {keep} newest pins of {pinned.model_name}"
            if why is not None:
                kept.append((pinned, why))
                continue
            removed.append(pinned)
            if not dry_run:
                _remove(pinned)
        freed = objects.collect_held([pinned.folder for pinned in removed], dry_run)
    return Collection(tuple(removed), tuple(kept), freed)


def _remove(pinned: PinnedVersion) -> None:
    log.info("removing pinned data version %s", pinned.describe())
    pinned_manifest_file(pinned.folder).unlink(missing_ok=True)  # first: what is left is an incomplete pin
    pinned_contents_file(pinned.folder).unlink(missing_ok=True)
    shutil.rmtree(pinned.folder)
