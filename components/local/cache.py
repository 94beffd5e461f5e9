"""The step cache: immutable output folders, one per (step, cache key), like Azure ML's step reuse.

An entry is `<cache>/<step>/<key>/`: one folder per output, plus `entry.json` with each output's content
hash and the key's ingredients (why this entry exists). A step writes its outputs into a staging folder
beside the entries (`.staging-*`), which is renamed into place only after the step succeeded and its
outputs were hashed and made read-only. The rename is atomic, so an entry is whole or absent; a failed
step's staging folder is deleted, and no entry is ever written to again. Before an entry is reused its
outputs are hashed again: one that changed anyway is set aside (`.damaged-*`) and its step runs again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from components.errors import PipelineError
from components.fingerprint import content_hash
from components.local.runs import write_json_atomically
from core.files import make_read_only

log = logging.getLogger(__name__)

ENTRY_FILE = "entry.json"
STAGING_PREFIX = ".staging-"
DAMAGED_PREFIX = ".damaged-"
# Bumped whenever what goes into a key, or the entry layout, changes: old entries are then never matched.
CACHE_FORMAT = "retrain-local-cache/1"


def cache_key(material: Mapping[str, Any]) -> str:
    """A key for everything that decides a step's outputs (128 bits of a canonical-JSON sha256)."""
    canonical = json.dumps({"format": CACHE_FORMAT, **material}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class CacheEntry:
    step: str
    key: str
    path: Path
    output_hashes: Mapping[str, str]
    run_id: str
    created_at: str
    material: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_hashes", MappingProxyType(dict(self.output_hashes)))

    def output_path(self, name: str) -> Path:
        return self.path / name

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "key": self.key,
            "output_hashes": dict(self.output_hashes),
            "run_id": self.run_id,
            "created_at": self.created_at,
            "material": dict(self.material),
        }


class StepCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def entry_dir(self, step: str, key: str) -> Path:
        return self.root / step / key

    def lookup(self, step: str, key: str) -> CacheEntry | None:
        path = self.entry_dir(step, key)
        try:
            data = json.loads((path / ENTRY_FILE).read_text())
        except FileNotFoundError:
            return None
        except ValueError as error:
            raise PipelineError(
                f"cache entry {path}: {ENTRY_FILE} unreadable ({error}); delete the folder to rebuild it"
            ) from None
        missing = sorted(name for name in data["output_hashes"] if not (path / name).exists())
        if missing:
            raise PipelineError(
                f"cache entry {path}: outputs {missing} are missing; delete the folder to rebuild it"
            )
        return CacheEntry(
            step=step,
            key=key,
            path=path,
            output_hashes=data["output_hashes"],
            run_id=data["run_id"],
            created_at=data["created_at"],
            material=data.get("material") or {},
        )

    def stage(self, step: str, run_id: str) -> Path:
        """A new, empty staging folder for one execution of `step`."""
        folder = self.root / step / f"{STAGING_PREFIX}{run_id}-{secrets.token_hex(4)}"
        folder.mkdir(parents=True)
        return folder

    def publish(self, staging: Path, entry: CacheEntry) -> CacheEntry | None:
        """Make `staging` (holding the outputs) the entry's folder; None if that entry already exists
        (a forced rerun, or another runner that finished first): entries are never replaced."""
        write_json_atomically(staging / ENTRY_FILE, entry.to_dict())
        make_read_only(staging)
        target = self.entry_dir(entry.step, entry.key)
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            log.info("cache entry %s exists; keeping it and this run's outputs apart", target)
            return None
        return CacheEntry(
            step=entry.step,
            key=entry.key,
            path=target,
            output_hashes=entry.output_hashes,
            run_id=entry.run_id,
            created_at=entry.created_at,
            material=entry.material,
        )

    @staticmethod
    def changed_output(entry: CacheEntry) -> str | None:
        """How an entry's outputs differ from the hashes recorded when it was published ("output 'made'
        changed since it was published (sha256 A... recorded, B... now)"); None when they are what was
        published. Its files are read-only, but root, a chmod or a replaced file gets past a mode."""
        for name, recorded in sorted(entry.output_hashes.items()):
            found = content_hash(entry.output_path(name))
            if found != recorded:
                was, now = (digest.removeprefix("sha256:")[:12] for digest in (recorded, found))
                return (
                    f"output '{name}' changed since it was published (sha256 {was}... recorded, {now}... now)"
                )
        return None

    def set_aside(self, entry: CacheEntry) -> Path:
        """Move a damaged entry out of the way (a hidden sibling, kept for a look): its key is free for the
        step's rerun to publish a true one."""
        aside = entry.path.with_name(f"{DAMAGED_PREFIX}{entry.key}-{secrets.token_hex(4)}")
        entry.path.rename(aside)
        return aside

    @staticmethod
    def discard(staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)
