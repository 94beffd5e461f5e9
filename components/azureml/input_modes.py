"""How an Azure ML step reads a data input: downloaded to its node's disk, or mounted read-only.

A download reads the data once, at full speed, before the step starts, and then every read is local; but
it must fit on the node's disk, beside everything else there. A read-only mount (`ro_mount`) fetches what
the step reads as it reads it, through a cache that evicts, so it never fills the disk, at the price of a
slower first read. So a data input is downloaded when it fits comfortably, at most `DOWNLOAD_SHARE` of the
disk (the other half is for the image, the step's outputs, and what a store holds beyond the version:
components/azureml/blob_snapshot.py), and mounted otherwise.

The disk is the compute's, from its YAML (components/compute/*.yml): Azure ML's compute schema has no disk
field and refuses unknown ones, so it is the tag `retrain.local_disk_gib`, the GiB a step's downloads may
take on one node (the VM size's temporary disk, or, for a size without one, what we count on of its OS
disk). An input's size is known at submission only for the pinned raw data (`DataRef.size_bytes`: what
its folder holds, the model's whole store, since a download fetches every object in it, not only the
version's: so a store that has grown past the disk is mounted, and the mount reads only the version's files
prep opens); where the size or the disk is unknown, the mode stays unset: Azure ML's default for
a folder, `ro_mount`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

import yaml

from components.errors import SpecError
from components.specs import COMPUTE_DIR

DISK_TAG = "retrain.local_disk_gib"
DOWNLOAD_SHARE = 0.5
DOWNLOAD = "download"
RO_MOUNT = "ro_mount"
_GIB = 1 << 30
_WHOLE_NUMBER = re.compile(r"[1-9][0-9]{0,5}")


@dataclass(frozen=True)
class ComputeDisk:
    """A compute's name and the bytes of local disk its nodes give a step's downloads."""

    name: str
    disk_bytes: int


def _disk_of(path: Path) -> ComputeDisk | None:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise SpecError(f"{path}: {str(error).splitlines()[0]}; expected an Azure ML compute YAML") from None
    if not isinstance(document, dict) or not isinstance(document.get("name"), str):
        raise SpecError(f"{path}: no compute name; expected an Azure ML compute YAML with `name:`")
    tags = document.get("tags") or {}
    value = tags.get(DISK_TAG) if isinstance(tags, dict) else None
    if value is None:
        return None
    if not _WHOLE_NUMBER.fullmatch(str(value)):
        raise SpecError(
            f"{path}: tags.{DISK_TAG} {value!r}; expected the GiB a step's downloads may take on one node, "
            'a whole number such as "64" (a string: tags are text)'
        )
    return ComputeDisk(document["name"], int(str(value)) * _GIB)


@cache
def compute_disks(compute_dir: Path = COMPUTE_DIR) -> Mapping[str, int]:
    """Each compute YAML's name -> its nodes' local disk for downloads in bytes, where the YAML says it."""
    disks = (_disk_of(path) for path in sorted(Path(compute_dir).glob("*.yml")))
    return MappingProxyType({disk.name: disk.disk_bytes for disk in disks if disk is not None})


def input_mode(size_bytes: int | None, disk_bytes: int | None) -> str | None:
    """`download` for data that takes at most DOWNLOAD_SHARE of the disk, `ro_mount` for more; None (Azure
    ML's default, a mount) when either is unknown."""
    if size_bytes is None or disk_bytes is None:
        return None
    return DOWNLOAD if size_bytes <= disk_bytes * DOWNLOAD_SHARE else RO_MOUNT
