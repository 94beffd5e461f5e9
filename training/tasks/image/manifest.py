"""The prepared image data version on disk: the manifest, and per split its shards and its keys.

A split is stored as array shards (training/data/shards.py: `<split>-00000.inputs.npy`, ..., uint8 pixels
[n, height, width, 3] in RGB, and `<split>-00000.targets.npy`, ..., the int64 class indices; rows in key
order, at most 64 MiB of pixels a file), which training reads a batch at a time rather than whole, and
`<split>.keys.json`, the images' keys in the same order. The manifest, written last, names every file with
its sha256, every raw image with its content sha256, the class names and the train split's per-channel
statistics. Readers check every file against the manifest before trusting it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError
from core.files import checked_bytes
from training.data.shards import SHARD_BYTES, Shard, ShardSplit, open_split, split_shards
from training.data.splits import SPLIT_NAMES, SplitFractions, split_config
from training.data.versions import (
    MANIFEST_NAME,
    check_split_document,
    content_version,
    parse_manifest,
    split_entry,
)
from training.tasks.image.raw_images import RESIZE_FILTER

# /2: pixels and class indices as memory-mappable shards, keys in a file of their own (/1: one `.npy` and one
# `.json` per split, read whole). A /1 version is refused with the hint to prepare again.
FORMAT = "retrain-image-prepared/2"
RERUN_HINT = "re-run `retrain prepare --task image` to write a fresh data version"
_CONTENT_TAG = b"retrain-image-split-content/1\n"
_STATS_CHUNK = 4096  # images per pass when summing channel statistics, to bound memory


@dataclass(frozen=True)
class SplitArrays:
    """One split in memory: keys sorted, class indices, and uint8 pixels [N, height, width, 3]."""

    keys: tuple[str, ...]
    labels: np.ndarray
    pixels: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class RawImageEntry:
    """One raw image a data version was built from: `<class>/<file name>` and its content hash."""

    key: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class ImageSplitEntry:
    """One split: its shards (pixels and class indices), its keys' file with its sha256, and the hash of
    what they hold."""

    name: str
    images: int
    shards: tuple[Shard, ...]
    keys_file: str
    keys_sha256: str
    content_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "shards": [shard.to_dict() for shard in self.shards],
            "keys_file": self.keys_file,
            "keys_sha256": self.keys_sha256,
            "content_sha256": self.content_sha256,
        }

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> ImageSplitEntry:
        return cls(
            name=name,
            images=int(data["images"]),
            shards=tuple(Shard.from_dict(shard) for shard in data["shards"]),
            keys_file=str(data["keys_file"]),
            keys_sha256=str(data["keys_sha256"]),
            content_sha256=str(data["content_sha256"]),
        )


@dataclass(frozen=True)
class PrepStats:
    """How the images of this version were obtained: decoded now, or reused from the previous version."""

    images: int
    decoded: int
    reused: int


@dataclass(frozen=True)
class ImageManifest:
    """Everything known about one prepared image data version; `data_version` is derived from content."""

    size: tuple[int, int]
    classes: tuple[str, ...]
    split: SplitFractions
    raw_files: tuple[RawImageEntry, ...]
    splits: tuple[ImageSplitEntry, ...]
    channel_mean: tuple[float, ...]
    channel_std: tuple[float, ...]
    stats: PrepStats
    decoder: str
    previous_version: str | None
    created_at: str
    resize: str = RESIZE_FILTER
    format: str = FORMAT

    @property
    def data_version(self) -> str:
        """`dv-` + 16 hex digits over the content-defining fields only (not provenance or time)."""
        content = {
            "format": self.format,
            "size": list(self.size),
            "resize": self.resize,
            "classes": list(self.classes),
            "split": split_config(self.split),
            "splits": {entry.name: entry.content_sha256 for entry in self.splits},
        }
        return content_version(content)

    def split_entry(self, name: str) -> ImageSplitEntry:
        return split_entry(self.splits, name)

    def to_json(self) -> str:
        document = {
            "format": self.format,
            "data_version": self.data_version,
            "previous_version": self.previous_version,
            "created_at": self.created_at,
            "size": list(self.size),
            "resize": self.resize,
            "decoder": self.decoder,
            "classes": list(self.classes),
            "split": split_config(self.split),
            "channel_mean": list(self.channel_mean),
            "channel_std": list(self.channel_std),
            "stats": vars(self.stats),
            "splits": {entry.name: entry.to_dict() for entry in self.splits},
            "raw_files": [vars(entry) for entry in self.raw_files],
        }
        return json.dumps(document, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "manifest") -> ImageManifest:
        return parse_manifest(text, source, _from_document, "image data version manifest", RERUN_HINT)


def _from_document(document: dict[str, Any]) -> ImageManifest:
    if document["format"] != FORMAT:
        raise ValueError(f"format {document['format']!r} is not {FORMAT!r}")
    split, splits = document["split"], document["splits"]
    check_split_document(split, splits)
    height, width = (int(side) for side in document["size"])
    return ImageManifest(
        size=(height, width),
        classes=tuple(str(name) for name in document["classes"]),
        split=SplitFractions(**split["fractions"]),
        raw_files=tuple(RawImageEntry(**entry) for entry in document["raw_files"]),
        splits=tuple(ImageSplitEntry.from_dict(name, splits[name]) for name in SPLIT_NAMES),
        channel_mean=tuple(float(value) for value in document["channel_mean"]),
        channel_std=tuple(float(value) for value in document["channel_std"]),
        stats=PrepStats(**document["stats"]),
        decoder=str(document["decoder"]),
        previous_version=document["previous_version"],
        created_at=document["created_at"],
        resize=document["resize"],
    )


def is_image_version(data_dir: Path) -> bool:
    """Whether `data_dir` holds a manifest of this format (a cheap look, not a verification)."""
    try:
        return json.loads((data_dir / MANIFEST_NAME).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_manifest(data_dir: Path) -> ImageManifest:
    """The manifest of a prepared image data version folder."""
    path = data_dir / MANIFEST_NAME
    if not path.is_file():
        raise InputError(
            f"{data_dir}: no {MANIFEST_NAME}, so it is not a prepared data version; {RERUN_HINT}"
        )
    return ImageManifest.from_json(path.read_text(encoding="utf-8"), source=str(path))


# -- splits -------------------------------------------------------------------------------------------------


def split_files(
    name: str, arrays: SplitArrays, shard_bytes: int = SHARD_BYTES
) -> tuple[dict[str, bytes], ImageSplitEntry]:
    """The files that store a split (its shards of at most `shard_bytes` of pixels, and its keys), and the
    manifest's entry for them."""
    files, shards = split_shards(
        name,
        np.ascontiguousarray(arrays.pixels, dtype=np.uint8),
        np.asarray(arrays.labels, dtype=np.int64),
        shard_bytes,
    )
    keys = json.dumps(list(arrays.keys)).encode()
    entry = ImageSplitEntry(
        name=name,
        images=len(arrays),
        shards=tuple(shards),
        keys_file=f"{name}.keys.json",
        keys_sha256=hashlib.sha256(keys).hexdigest(),
        content_sha256=content_sha256(arrays),
    )
    return {**files, entry.keys_file: keys}, entry


def open_pixels(data_dir: Path, manifest: ImageManifest, name: str) -> ShardSplit:
    """One split's shards, opened: `split[indices]` gives `(uint8 pixels [n, height, width, 3],
    int64 class indices [n])`. Every file is checked against its sha256 first, then its shape and class
    indices against the manifest, so what is read is what prepare wrote for it."""
    entry = manifest.split_entry(name)
    try:
        split = open_split(data_dir, entry.shards)
    except InputError as error:
        raise InputError(f"{error}; {RERUN_HINT}") from None
    for shard in entry.shards:
        _check_shard(data_dir, shard, manifest)
    if len(split) != entry.images:
        raise InputError(
            f"{data_dir}: the {name} split's shards hold {len(split)} images, not {entry.images} as the "
            f"manifest says; {RERUN_HINT}"
        )
    return split


def _check_shard(data_dir: Path, shard: Shard, manifest: ImageManifest) -> None:
    """A verified shard holds what the manifest says: `rows` images at its size, each with the index of one
    of its classes. Both files are mapped for the check alone: the pixels' shape is read from the header,
    and only the class indices (8 bytes an image) are read."""
    pixels = np.load(data_dir / shard.inputs, mmap_mode="r", allow_pickle=False)
    labels = np.load(data_dir / shard.targets, mmap_mode="r", allow_pickle=False)
    expected = (shard.rows, *manifest.size, 3)
    found = (pixels.dtype, pixels.shape, labels.dtype, labels.shape)
    if found != (np.uint8, expected, np.int64, expected[:1]):
        raise InputError(
            f"{data_dir / shard.inputs}: holds {pixels.dtype} {pixels.shape} with {labels.dtype} classes "
            f"{labels.shape}, not uint8 {expected} with int64 classes {expected[:1]} as the manifest says; "
            f"{RERUN_HINT}"
        )
    if labels.size and not 0 <= labels.min() <= labels.max() < len(manifest.classes):
        raise InputError(
            f"{data_dir / shard.targets}: class indices outside 0..{len(manifest.classes) - 1}, the "
            f"manifest's classes; {RERUN_HINT}"
        )


def read_keys(data_dir: Path, manifest: ImageManifest, name: str) -> tuple[str, ...]:
    """One split's image keys in row order, after checking their file is the one the manifest names."""
    entry = manifest.split_entry(name)
    path = data_dir / entry.keys_file
    keys = json.loads(checked_bytes(path, entry.keys_sha256, f"{name} split's keys", RERUN_HINT))
    if len(keys) != entry.images:
        raise InputError(f"{path}: {len(keys)} keys, not {entry.images} as the manifest says; {RERUN_HINT}")
    return tuple(str(key) for key in keys)


def read_split(data_dir: Path, manifest: ImageManifest, name: str) -> SplitArrays:
    """One split's keys, class indices and pixels, whole in memory (checked as `open_pixels` and
    `read_keys` check them): for looking at a version, not for training, which reads the shards."""
    keys = read_keys(data_dir, manifest, name)
    pixels, labels = open_pixels(data_dir, manifest, name)[slice(None)]
    return SplitArrays(keys=keys, labels=labels.numpy(), pixels=pixels.numpy())


def content_sha256(arrays: SplitArrays) -> str:
    """Hash of what a split holds (keys, labels, pixels in row order), independent of the file encoding."""
    encoded = [key.encode() for key in arrays.keys]
    digest = hashlib.sha256(_CONTENT_TAG)
    digest.update(np.array(arrays.pixels.shape, dtype="<i8").tobytes())
    digest.update(np.array([len(key) for key in encoded], dtype="<i8").tobytes())
    digest.update(b"".join(encoded))
    digest.update(np.asarray(arrays.labels, dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(arrays.pixels, dtype=np.uint8).tobytes())
    return digest.hexdigest()


def channel_statistics(pixels: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population std of uint8 [N, H, W, 3] pixels scaled to [0, 1], in float64."""
    count = pixels.shape[0] * pixels.shape[1] * pixels.shape[2]
    if count == 0:
        raise InputError("channel statistics need at least one pixel; expected a non-empty train split")
    total = np.zeros(3, dtype=np.float64)
    squares = np.zeros(3, dtype=np.float64)
    for start in range(0, pixels.shape[0], _STATS_CHUNK):
        chunk = pixels[start : start + _STATS_CHUNK].reshape(-1, 3).astype(np.float64) / 255.0
        total += chunk.sum(axis=0)
        squares += np.square(chunk).sum(axis=0)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - np.square(mean), 0.0))
    return tuple(float(value) for value in mean), tuple(float(value) for value in std)
