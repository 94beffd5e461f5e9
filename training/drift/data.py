"""The two sides of a drift check: the champion's reference data and the newly arrived raw batches.

The reference is the train split of a prepared data version: either the one the champion was trained on,
found through its lineage tags (the manifest's path and sha256), or one named explicitly. The current data
is a folder of raw batch files, read and validated as `prepare` reads them, one row per key (the last
delivery of each), with only the feature columns compared.

The current data's raw data version (`rd-<16 hex>`, as components/data_version.py computes it) is known
when the folder is a pinned snapshot: a local pin or an Azure ML snapshot keeps its manifest beside the
folder, as `<folder>.manifest.json`. Otherwise the version is unknown and the event omits it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from training.errors import InputError
from training.gate.lineage import DATA_VERSION, MANIFEST_PATH, MANIFEST_SHA256, RAW_DATA_VERSION, file_sha256
from training.tasks.tabular.prepare import deduplicate
from training.tasks.tabular.raw_files import list_raw_files, read_raw_file
from training.tasks.tabular.schema import TableSchema, feature_matrix, read_manifest, read_split_table

if TYPE_CHECKING:
    from training.gate.registry import ModelRegistry

log = logging.getLogger(__name__)

REFERENCE_SPLIT = "train"
SNAPSHOT_MANIFEST_SUFFIX = ".manifest.json"  # components/data_version.py's MANIFEST_SUFFIX
# What components/data_version.py counts as raw data: exactly these suffixes, directly in the folder.
SNAPSHOT_SUFFIXES = (".csv", ".parquet")
_RAW_VERSION = re.compile(r"rd-[0-9a-f]{16}")


@dataclass(frozen=True)
class ReferenceData:
    """The reference features and where they came from."""

    features: np.ndarray
    schema: TableSchema
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
    """The newly arrived features, one row per key, and the raw files they came from."""

    features: np.ndarray
    folder: Path
    files: tuple[str, ...]
    raw_rows: int
    data_version: str | None

    def describe(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "files": list(self.files),
            "raw_rows": self.raw_rows,
            "rows": len(self.features),
            "data_version": self.data_version,
        }


# -- reference -------------------------------------------------------------------------------------------


def reference_from_folder(data_dir: Path) -> ReferenceData:
    """The train split of the prepared data version in `data_dir`, verified against its manifest."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise InputError(f"--reference {data_dir}: no such folder; expected a prepared data version")
    manifest = read_manifest(data_dir)
    table = read_split_table(data_dir, manifest, REFERENCE_SPLIT)
    if table.num_rows == 0:
        raise InputError(f"--reference {data_dir}: its {REFERENCE_SPLIT} split holds no rows")
    return ReferenceData(
        features=feature_matrix(table, manifest.schema),
        schema=manifest.schema,
        data_dir=data_dir,
        data_version=manifest.data_version,
    )


def reference_from_lineage(tags: Mapping[str, str], where: str, model_version: str) -> ReferenceData:
    """The reference a registered version names in its lineage tags; `where` names the version in errors.

    The manifest must still be at its recorded path with its recorded sha256, and the split files beside
    it must match the manifest; a cleaned-up or changed data version is refused, never approximated.
    """
    recorded = tags.get(MANIFEST_PATH)
    expected_sha256, expected_version = tags.get(MANIFEST_SHA256), tags.get(DATA_VERSION)
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
    reference = reference_from_folder(manifest.parent)
    if reference.data_version != expected_version:
        raise InputError(
            f"{manifest.parent} holds {reference.data_version}, but {where} was trained on {expected_version}"
        )
    return ReferenceData(
        features=reference.features,
        schema=reference.schema,
        data_dir=reference.data_dir,
        data_version=reference.data_version,
        raw_data_version=tags.get(RAW_DATA_VERSION),
        model_version=model_version,
    )


def champion_reference(registry: ModelRegistry, model_name: str) -> ReferenceData:
    """The reference data of the model's current champion, through its lineage."""
    from training.gate.registry import CHAMPION

    champion = registry.alias_holder(model_name, CHAMPION)
    if champion is None:
        raise InputError(
            f"model {model_name!r} has no {CHAMPION} in the registry, so there is no reference data; "
            "pass --reference DIR with a prepared data version"
        )
    log.info("reference: %s, the %s", champion.uri, CHAMPION)
    return reference_from_lineage(champion.tags, champion.uri, champion.version)


# -- current ---------------------------------------------------------------------------------------------


def read_current(folder: Path, schema: TableSchema) -> CurrentData:
    """The raw batches in `folder`, validated against `schema`, one row per key (its last delivery)."""
    folder = Path(folder)
    paths = list_raw_files(folder)
    table = pa.concat_tables([read_raw_file(path, schema) for path in paths])
    if table.num_rows == 0:
        raise InputError(
            f"--current {folder}: its {len(paths)} raw file(s) hold no data rows; expected rows under a "
            f"header of {schema.describe_columns()}"
        )
    unique = deduplicate(table, schema).table
    return CurrentData(
        features=feature_matrix(unique, schema),
        folder=folder,
        files=tuple(path.name for path in paths),
        raw_rows=table.num_rows,
        data_version=raw_data_version(folder),
    )


def raw_data_version(folder: Path) -> str | None:
    """The pinned raw data version of `folder`, from the snapshot manifest beside it; None when there is
    none, or when it does not describe the folder (a warning says why)."""
    folder = Path(folder).resolve()
    manifest_path = folder.with_name(folder.name + SNAPSHOT_MANIFEST_SUFFIX)
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


def snapshot_version(entries: list[tuple[str, int, str]]) -> str:
    """components/data_version.py's version of (name, size, fingerprint) entries: the sha256 of their
    canonical JSON, sorted by name."""
    canonical = json.dumps([list(entry) for entry in sorted(entries)], separators=(",", ":"))
    return "rd-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _manifest_problem(folder: Path, entries: list[tuple[str, int, str]], stated: str) -> str | None:
    if not _RAW_VERSION.fullmatch(stated) or snapshot_version(entries) != stated:
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
