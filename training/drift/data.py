"""The two sides of a drift check: the champion's reference data and the newly arrived raw data, as the
model's task sees them.

Both sides are the task's drift features (`Task.drift_features`): for the tabular task its feature
columns, for the image task per-image statistics. The reference is the train split of a prepared data
version: either the one the champion was trained on, found through its lineage tags (the manifest's path
and sha256, or the data folder), or one named explicitly. The current data is a folder of raw files,
read and validated as `prepare` reads them.

The task comes from `--task`, else from the champion's lineage (a task file is taken from the copy
registered with the model when the recorded path is not on this machine), else it is `tabular`.

The current data's raw data version (`rd-<16 hex>`, as components/data_version.py computes it) is known
when the folder is a pinned snapshot: a local pin or an Azure ML snapshot keeps its manifest beside the
folder, as `<folder>.manifest.json`. Otherwise the version is unknown and the event omits it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from core.errors import InputError
from core.task_ref import parse_task_ref
from core.versions import MANIFEST_SUFFIX, is_raw_version, raw_version
from training.data.token_shares import check_same_groups, column_names, share_values, vocabulary_of
from training.gate.lineage import (
    DATA_DIR,
    DATA_VERSION,
    MANIFEST_FILE,
    MANIFEST_PATH,
    MANIFEST_SHA256,
    NONE,
    RAW_DATA_VERSION,
    file_sha256,
    task_from_tags,
)
from training.gate.lineage import tag as lineage_tag
from training.tasks.base import FeatureTable, Task

if TYPE_CHECKING:
    from training.gate.registry import ModelRegistry, VersionInfo

log = logging.getLogger(__name__)

DEFAULT_TASK = "tabular"
REFERENCE_SPLIT = "train"
# What components/data_version.py counts as raw data: exactly these suffixes, directly in the folder.
SNAPSHOT_SUFFIXES = (".csv", ".parquet")


@dataclass(frozen=True)
class ReferenceData:
    """The reference features and where they came from."""

    features: FeatureTable
    data_dir: Path
    data_version: str
    raw_data_version: str | None = None
    model_version: str | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "source": "lineage" if self.model_version else "folder",
            "model_version": self.model_version,
            "data_dir": str(self.data_dir),
            "split": REFERENCE_SPLIT,
            "data_version": self.data_version,
            "raw_data_version": self.raw_data_version,
            "rows": len(self.features),
        }


@dataclass(frozen=True)
class CurrentData:
    """The newly arrived features (as the task reads raw files: one row per item) and their files."""

    features: FeatureTable
    folder: Path
    files: tuple[str, ...]
    data_version: str | None

    def describe(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "files": list(self.files),
            "rows": len(self.features),
            "data_version": self.data_version,
        }


# -- the task --------------------------------------------------------------------------------------------


def drift_task(
    registry: ModelRegistry | None,
    champion: VersionInfo | None,
    task_ref: str | None,
    task_options: Mapping[str, Any] | None,
    scratch: Path,
) -> tuple[Task, str]:
    """The task whose features are compared, and where it came from: `--task`, else the champion's
    lineage, else the built-in tabular task."""
    from training.tasks.loader import load_task

    if task_ref is not None:
        return load_task(task_ref, task_options or {}), "--task"
    recorded = task_from_tags(champion.tags) if champion is not None else None
    if recorded is None or registry is None or champion is None:
        return load_task(DEFAULT_TASK, task_options or {}), "default"
    ref = _recorded_task_ref(registry, champion, recorded, scratch)
    return load_task(ref, recorded["options"]), f"{champion.uri}'s lineage"


def _recorded_task_ref(
    registry: ModelRegistry, champion: VersionInfo, recorded: Mapping[str, Any], scratch: Path
) -> str:
    """The champion's task reference, runnable here: a task file at its recorded path when it still has
    the recorded sha256, else the copy registered with the model."""
    from training.gate.registry import ARTIFACTS_FOLDER

    ref = parse_task_ref(str(recorded["ref"]), Path.cwd())
    if ref.path is None:
        return ref.text
    expected = recorded.get("file_sha256")
    if ref.path.is_file() and file_sha256(ref.path) == expected:
        return ref.text
    copy = registry.download_model_file(champion, f"{ARTIFACTS_FOLDER}/{ref.path.name}", scratch)
    if expected and file_sha256(copy) != expected:
        raise InputError(
            f"{champion.uri}: its task file copy {ref.path.name} does not have the recorded sha256; "
            "give --task with the task it was trained with"
        )
    log.info(
        "task file %s is not here as recorded; using the copy registered with %s", ref.path, champion.uri
    )
    return f"{copy}:{ref.attribute}"


# -- reference -------------------------------------------------------------------------------------------


def _data_version(task: Task, data_dir: Path) -> str:
    """A prepared version's data version: from its manifest when it has one, else as the task loads it."""
    manifest = data_dir / MANIFEST_FILE
    if manifest.is_file():
        try:
            version = json.loads(manifest.read_text(encoding="utf-8")).get("data_version")
        except (ValueError, AttributeError, UnicodeDecodeError):
            version = None
        if isinstance(version, str) and version:
            return version
    return task.load(data_dir).data_version


def reference_from_folder(task: Task, data_dir: Path) -> ReferenceData:
    """The drift features of the train split of the prepared data version in `data_dir`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise InputError(f"--reference {data_dir}: no such folder; expected a prepared data version")
    features = task.drift_features(data_dir, prepared=True)
    if len(features) == 0:
        raise InputError(f"--reference {data_dir}: its {REFERENCE_SPLIT} split holds no rows")
    return ReferenceData(features=features, data_dir=data_dir, data_version=_data_version(task, data_dir))


def _recorded_folder(tags: Mapping[str, str], where: str) -> Path:
    """The prepared data folder the tags name, its manifest verified against the recorded sha256."""
    recorded, expected_sha256 = tags.get(MANIFEST_PATH), tags.get(MANIFEST_SHA256)
    expected_version = lineage_tag(tags, DATA_VERSION)
    if recorded == NONE and expected_sha256 == NONE and tags.get(DATA_DIR) not in (None, NONE):
        folder = Path(tags[DATA_DIR])  # a task that writes no manifest: the folder and data version only
        if not folder.is_dir():
            raise InputError(
                f"{where} was trained on {expected_version} in {folder}, which is gone (not on this "
                "machine, or cleaned up); pass --reference DIR with that prepared data version"
            )
        return folder
    if not recorded or not expected_sha256 or not expected_version:
        raise InputError(
            f"{where} has no {MANIFEST_PATH}, {MANIFEST_SHA256} and {DATA_VERSION} tags; it was not "
            "registered by retrain register. Pass --reference DIR with a prepared data version"
        )
    manifest = Path(recorded)
    if not manifest.is_file():
        raise InputError(
            f"{where} was trained on {expected_version}, whose manifest {manifest} is gone (not on this "
            f"machine, or cleaned up); pass --reference DIR with that prepared data version"
        )
    if file_sha256(manifest) != expected_sha256:
        raise InputError(
            f"{manifest}: sha256 differs from {where}'s {MANIFEST_SHA256} tag, the data version was changed; "
            "pass --reference DIR with the prepared data version it was trained on"
        )
    return manifest.parent


def reference_from_lineage(
    task: Task, tags: Mapping[str, str], where: str, model_version: str
) -> ReferenceData:
    """The reference a registered version names in its lineage tags; `where` names the version in errors.

    The data must still be where it was recorded, its manifest with the recorded sha256; a cleaned-up or
    changed data version is refused, never approximated.
    """
    folder = _recorded_folder(tags, where)
    reference = reference_from_folder(task, folder)
    trained_on = lineage_tag(tags, DATA_VERSION)
    if reference.data_version != trained_on:
        raise InputError(f"{folder} holds {reference.data_version}, but {where} was trained on {trained_on}")
    return ReferenceData(
        features=reference.features,
        data_dir=reference.data_dir,
        data_version=reference.data_version,
        raw_data_version=lineage_tag(tags, RAW_DATA_VERSION),
        model_version=model_version,
    )


def champion_of(registry: ModelRegistry, model_name: str) -> VersionInfo:
    """The model's current champion, whose lineage names the reference data (and the task)."""
    from training.gate.registry import CHAMPION

    champion = registry.alias_holder(model_name, CHAMPION)
    if champion is None:
        raise InputError(
            f"model {model_name!r} has no {CHAMPION} in the registry, so there is no reference data; "
            "pass --reference DIR with a prepared data version"
        )
    log.info("reference: %s, the %s", champion.uri, CHAMPION)
    return champion


# -- current ---------------------------------------------------------------------------------------------


def raw_files(task: Task, folder: Path) -> tuple[str, ...]:
    """The raw files the task reads in `folder` (its suffixes, in subfolders too, hidden ones skipped)."""
    suffixes = {suffix.lower() for suffix in task.raw_suffixes}
    return tuple(
        str(path.relative_to(folder))
        for path in sorted(folder.rglob("*"))
        if path.is_file()
        and path.suffix.lower() in suffixes
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )


def read_current(task: Task, folder: Path) -> CurrentData:
    """The drift features of the raw files in `folder`, as the task reads them."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"--current {folder}: no such folder; expected a folder of raw files")
    features = task.drift_features(folder, prepared=False)
    if len(features) == 0:
        raise InputError(f"--current {folder}: the task found no data in it")
    return CurrentData(
        features=features,
        folder=folder,
        files=raw_files(task, folder),
        data_version=raw_data_version(folder),
    )


def comparable(reference: FeatureTable, current: FeatureTable) -> tuple[FeatureTable, np.ndarray]:
    """The reference as numbers only, and the current values in its column order: each token group of
    either side becomes share columns by the reference group's vocabulary, so a category the current data
    brings first is counted in the reference's `NAME:other` column, and one it lacks is a column of zeros."""
    check_same_groups(reference.groups, current.groups)
    current_groups = {group.name: group for group in current.groups}
    names, reference_parts, current_parts = (
        list(reference.names),
        [reference.values],
        [aligned_numbers(reference, current)],
    )
    for group in reference.groups:
        vocabulary = vocabulary_of(group)
        names += column_names(group, vocabulary)
        reference_parts.append(share_values(group, vocabulary))
        current_parts.append(share_values(current_groups[group.name], vocabulary))
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise InputError(f"drift features: {twice[:5]} named twice once shares are columns; rename a feature")
    numeric = FeatureTable(tuple(names), np.hstack(reference_parts))
    return numeric, np.hstack(current_parts)


def aligned_numbers(reference: FeatureTable, current: FeatureTable) -> np.ndarray:
    """The current numeric values in the reference's numeric feature order."""
    return aligned(
        FeatureTable(reference.names, reference.values), FeatureTable(current.names, current.values)
    )


def aligned(reference: FeatureTable, current: FeatureTable) -> np.ndarray:
    """The current values in the reference's feature order; features the two do not share are refused."""
    if current.names == reference.names:
        return current.values
    missing = [name for name in reference.names if name not in current.names]
    extra = [name for name in current.names if name not in reference.names]
    if missing or extra:
        raise InputError(
            f"--current: its features differ from the reference's (missing {missing[:5]}, extra "
            f"{extra[:5]}); expected data of the same task and options"
        )
    order = [current.names.index(name) for name in reference.names]
    return current.values[:, order]


def raw_data_version(folder: Path) -> str | None:
    """The pinned raw data version of `folder`, from the snapshot manifest beside it; None when there is
    none, or when it does not describe the folder (a warning says why)."""
    folder = Path(folder).resolve()
    manifest_path = folder.with_name(folder.name + MANIFEST_SUFFIX)
    if not manifest_path.is_file():
        log.info("no snapshot manifest at %s: the current data version is unknown", manifest_path)
        return None
    try:
        document = json.loads(manifest_path.read_text(encoding="utf-8"))
        entries = [(str(f["name"]), int(f["size"]), str(f["fingerprint"])) for f in document["files"]]
        stated = str(document["version"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning(
            "%s is not a readable data manifest (%s); the data version is unknown", manifest_path, error
        )
        return None
    problem = _manifest_problem(folder, entries, stated)
    if problem:
        log.warning("%s: %s; the current data version is unknown", manifest_path, problem)
        return None
    return stated


def _manifest_problem(folder: Path, entries: list[tuple[str, int, str]], stated: str) -> str | None:
    if not is_raw_version(stated) or raw_version(entries) != stated:
        return f"it says {stated!r}, which is not the version of its content"
    present = {
        path.name: path.stat().st_size
        for path in folder.iterdir()
        if path.is_file() and path.suffix in SNAPSHOT_SUFFIXES
    }
    listed = {name: size for name, size, _ in entries}
    if present != listed:
        return f"it lists {sorted(listed)}, but the folder holds {sorted(present)} (or other sizes)"
    for name, _, fingerprint in entries:
        # A local pin's fingerprints are sha256 digests, which can be checked; Blob eTags cannot be here.
        if fingerprint.startswith("sha256:") and fingerprint != f"sha256:{file_sha256(folder / name)}":
            return f"{name} differs from the file it pinned"
    return None
