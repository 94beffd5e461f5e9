"""The prepared image data version on disk: the manifest and one pair of files per split.

A split is stored as `<split>.npy`, a uint8 [N, height, width, 3] array (RGB, rows in key order), and
`<split>.json`, the images' keys and class indices in the same order. The manifest, written last, names
every file with its sha256, every raw image with its content sha256, the class names and the train split's
per-channel statistics. Readers check every file against the manifest before trusting it.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError
from training.data.splits import SPLIT_NAMES, SplitFractions, split_config
from training.data.versions import (
    MANIFEST_NAME,
    check_split_document,
    content_version,
    parse_manifest,
    split_entry,
    without_name,
)
from training.tasks.image.raw_images import RESIZE_FILTER

FORMAT = "retrain-image-prepared/1"
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
    """One split's two files with their sha256, and the hash of what they hold."""

    name: str
    images: int
    pixels_file: str
    pixels_sha256: str
    index_file: str
    index_sha256: str
    content_sha256: str


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
            "splits": {entry.name: without_name(entry) for entry in self.splits},
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
        splits=tuple(ImageSplitEntry(name=name, **splits[name]) for name in SPLIT_NAMES),
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


def split_files(name: str, arrays: SplitArrays) -> tuple[dict[str, bytes], ImageSplitEntry]:
    """The two files that store a split, and the manifest's entry for them."""
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.ascontiguousarray(arrays.pixels, dtype=np.uint8), allow_pickle=False)
    pixels = buffer.getvalue()
    index = json.dumps({"keys": list(arrays.keys), "labels": arrays.labels.tolist()}).encode()
    entry = ImageSplitEntry(
        name=name,
        images=len(arrays),
        pixels_file=f"{name}.npy",
        pixels_sha256=hashlib.sha256(pixels).hexdigest(),
        index_file=f"{name}.json",
        index_sha256=hashlib.sha256(index).hexdigest(),
        content_sha256=content_sha256(arrays),
    )
    return {entry.pixels_file: pixels, entry.index_file: index}, entry


def read_split(data_dir: Path, manifest: ImageManifest, name: str) -> SplitArrays:
    """One split's arrays, after checking both files are byte for byte the ones the manifest names."""
    entry = manifest.split_entry(name)
    pixels_bytes = _verified_bytes(data_dir / entry.pixels_file, entry.pixels_sha256, name)
    index_bytes = _verified_bytes(data_dir / entry.index_file, entry.index_sha256, name)
    pixels = np.lib.format.read_array(io.BytesIO(pixels_bytes), allow_pickle=False)
    index = json.loads(index_bytes)
    keys, labels = tuple(index["keys"]), np.asarray(index["labels"], dtype=np.int64)
    expected_shape = (entry.images, *manifest.size, 3)
    if pixels.dtype != np.uint8 or pixels.shape != expected_shape or len(keys) != entry.images:
        raise InputError(
            f"{data_dir / entry.pixels_file}: holds {pixels.dtype} {pixels.shape} for {len(keys)} keys, "
            f"not uint8 {expected_shape} as the manifest says; {RERUN_HINT}"
        )
    if labels.shape != (entry.images,) or (
        labels.size and not 0 <= labels.min() <= labels.max() < len(manifest.classes)
    ):
        raise InputError(
            f"{data_dir / entry.index_file}: class indices differ from the manifest; {RERUN_HINT}"
        )
    return SplitArrays(keys=keys, labels=labels, pixels=pixels)


def _verified_bytes(path: Path, sha256: str, split: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(f"{path}: cannot read the {split} split ({error.strerror}); {RERUN_HINT}") from error
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(f"{path}: sha256 differs from the manifest, the file was changed; {RERUN_HINT}")
    return data


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
