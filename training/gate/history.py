"""A model's history in the registry: its versions, one version's lineage, and stepping the champion back.

Lineage must reach the data manifest. The version's tags name the prepared data's manifest.json and its
sha256; when that file is gone (caches get cleaned) or changed, the copy registered with the model's
artifacts is used instead, and either one is trusted only if its sha256 is the recorded one.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.errors import InputError
from training.gate.lineage import (
    DATA_DIR,
    MANIFEST_FILE,
    MANIFEST_PATH,
    MANIFEST_SHA256,
    REPLACED_VERSION,
    ROLLBACK_AT,
    ROLLBACK_REASON,
    ROLLBACK_TO,
    describe_tags,
    file_sha256,
    metrics_from_tags,
)
from training.gate.lock import RegistryLock
from training.gate.registry import (
    ARTIFACTS_FOLDER,
    CHAMPION,
    PREVIOUS,
    ModelRegistry,
    RegistryError,
    VersionInfo,
)

log = logging.getLogger(__name__)


def _created_at(info: VersionInfo) -> str:
    return datetime.fromtimestamp(info.created_ms / 1000, UTC).isoformat(timespec="seconds")


def version_summary(info: VersionInfo) -> dict[str, Any]:
    return {
        "version": info.version,
        "aliases": list(info.aliases),
        "created_at": _created_at(info),
        "metrics": metrics_from_tags(info.tags),
        "lineage": describe_tags(info.tags),
        "run_id": info.run_id,
        "source": info.source,
    }


def model_listing(registry: ModelRegistry, model_name: str) -> dict[str, Any]:
    """Every version of the model, newest first, with aliases, metrics and lineage."""
    return {
        "model_name": model_name,
        "aliases": registry.aliases(model_name),
        "versions": [version_summary(info) for info in registry.versions(model_name)],
    }


def _manifest_candidates(registry: ModelRegistry, info: VersionInfo, scratch: Path) -> list[tuple[str, Path]]:
    """Where the manifest may be: the recorded path first, then the copy in the model's artifacts."""
    found = []
    recorded = info.tags.get(MANIFEST_PATH)
    if recorded and Path(recorded).is_file():
        found.append((recorded, Path(recorded)))
    try:
        copy = registry.download_model_file(info, f"{ARTIFACTS_FOLDER}/{MANIFEST_FILE}", scratch)
    except RegistryError as error:
        log.info("no manifest copy in %s's artifacts: %s", info.uri, error)
    else:
        found.append((f"{info.uri}/{ARTIFACTS_FOLDER}/{MANIFEST_FILE}", copy))
    return found


def verified_manifest(
    registry: ModelRegistry, info: VersionInfo, scratch: Path
) -> tuple[str, dict[str, Any]]:
    """The version's data manifest (as JSON: each task writes its own) and where it was found, after
    checking it against the recorded sha256."""
    expected = info.tags.get(MANIFEST_SHA256)
    if expected == "none":
        raise InputError(
            f"{info.uri} was trained on data without a {MANIFEST_FILE} (its task writes none); its data "
            f"folder was {info.tags.get(DATA_DIR)}"
        )
    if not expected:
        raise InputError(
            f"{info.uri} has no {MANIFEST_SHA256} tag; it was not registered by retrain register"
        )
    tried = []
    for location, path in _manifest_candidates(registry, info, scratch):
        if file_sha256(path) == expected:
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as error:
                raise InputError(f"{location}: not a JSON data manifest ({error})") from None
            if not isinstance(document, dict):
                raise InputError(f"{location}: not a JSON object; expected a data manifest")
            return location, document
        tried.append(f"{location} (sha256 differs)")
    recorded = info.tags.get(MANIFEST_PATH, "no path")
    raise InputError(
        f"{info.uri}: no data manifest with sha256 {expected[:12]} at {recorded} or in the model's artifacts "
        f"(tried: {', '.join(tried) or 'nothing found'})"
    )


def lineage_report(registry: ModelRegistry, model_name: str, version: str, scratch: Path) -> dict[str, Any]:
    """From a version back through its gate decision, pipeline job and trigger to its data manifest."""
    info = registry.version(model_name, version)
    location, manifest = verified_manifest(registry, info, scratch)
    chain = describe_tags(info.tags)
    if manifest.get("data_version") != chain["data_version"]:
        raise InputError(
            f"{info.uri}: the manifest at {location} is of {manifest.get('data_version')}, but the version "
            f"was trained on {chain['data_version']}"
        )
    splits = manifest.get("splits") or {}
    return {
        "model_name": model_name,
        "version": info.version,
        "aliases": list(info.aliases),
        "created_at": _created_at(info),
        "metrics": metrics_from_tags(info.tags),
        "lineage": chain,
        "manifest": {
            "location": location,
            "sha256": info.tags[MANIFEST_SHA256],
            "data_version": manifest.get("data_version"),
            "previous_version": manifest.get("previous_version"),
            "raw_files": list(manifest.get("raw_files") or []),
            "splits": {
                name: {key: entry[key] for key in ("rows", "file", "parts") if key in entry}
                for name, entry in (splits.items() if isinstance(splits, dict) else [])
                if isinstance(entry, dict)
            },
            "stats": manifest.get("stats"),
        },
    }


def rollback(
    registry: ModelRegistry, lock: RegistryLock, model_name: str, reason: str, now: datetime
) -> dict[str, str | None]:
    """Move `champion` to the `previous` version, and `previous` to the champion that one had replaced.

    The version rolled back from keeps its registration and is tagged with the reason and time; repeated
    rollbacks walk back through the champions in the order they were promoted.
    """
    if not reason.strip():
        raise InputError("--reason is empty; say why the champion is rolled back")
    with lock:
        aliases = registry.aliases(model_name)
        current, target = aliases.get(CHAMPION), aliases.get(PREVIOUS)
        if current is None:
            raise InputError(f"model {model_name!r} has no champion; there is nothing to roll back")
        if target is None or target == current:
            raise InputError(
                f"model {model_name!r} has no 'previous' version to roll back to; its champion is v{current}"
            )
        before = registry.version(model_name, target).tags.get(REPLACED_VERSION)
        registry.tag_version(
            model_name, current, {ROLLBACK_REASON: reason, ROLLBACK_AT: now.isoformat(), ROLLBACK_TO: target}
        )
        registry.set_alias(model_name, CHAMPION, target)
        if before and before not in ("none", current) and before.isdigit():
            registry.set_alias(model_name, PREVIOUS, before)
            previous: str | None = before
        else:
            registry.remove_alias(model_name, PREVIOUS)
            previous = None
    log.info("%s: rolled back from v%s to v%s (%s)", model_name, current, target, reason)
    return {"rolled_back_from": current, "champion": target, "previous": previous}
