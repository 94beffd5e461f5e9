"""Prepare images: a class-folder tree of PNG/JPEG files in, one content-versioned data version out.

Everything happens in memory before anything is written: list and fingerprint every image, decode the ones
the previous version has not seen with the same content (the others' pixels are copied from its mapped
shards; an image that cannot be decoded is rejected, naming itself, and the others are prepared without
it), assign each image to a split by a salted hash of its key `<class>/<file name>` alone (so an image never
changes split as data grows), and build the manifest. Then `publish` writes the files, the manifest last:
each split as shards of at most `shard_bytes` of pixels, which training reads (training/data/shards.py).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from core.errors import InputError
from core.rejected_inputs import RawFilesRejected, rejected_for
from core.text import escaped
from training.data.publish import publish
from training.data.shards import SHARD_BYTES, ShardSplit
from training.data.splits import SPLIT_NAMES, SplitFractions, assign_splits
from training.data.versions import existing_manifest, same_version_or_refuse
from training.tasks.image.manifest import (
    MANIFEST_NAME,
    ImageManifest,
    PrepStats,
    RawImageEntry,
    SplitArrays,
    channel_statistics,
    open_pixels,
    read_keys,
    read_manifest,
    split_files,
)
from training.tasks.image.raw_images import RawImage, decode_image, fingerprint, list_labelled_images

log = logging.getLogger(__name__)

_COPY_IMAGES = 4096  # images copied from the previous version's shards at once: a bounded gather


@dataclass(frozen=True)
class _Stored:
    """Where the previous version holds an image: the raw file's sha256 it was decoded from, its split
    and its row there."""

    sha256: str
    split: str
    row: int


@dataclass(frozen=True)
class _Reusable:
    """What a previous version offers: each of its images by key, and its splits' mapped shards."""

    images: Mapping[str, _Stored]
    splits: Mapping[str, ShardSplit]


_NOTHING = _Reusable({}, {})


def decoder_name() -> str:
    """The decoder's name and version: another version may resize to other pixels, so a version prepared
    by another one is not reused."""
    import PIL

    return f"Pillow {PIL.__version__}"


def prepare_images(
    raw: Path,
    out: Path,
    *,
    size: tuple[int, int],
    previous: Path | None = None,
    split: SplitFractions | None = None,
    shard_bytes: int = SHARD_BYTES,
) -> ImageManifest:
    """Prepare the images under `raw` at `size` (height, width) as a data version in `out` (new or empty).

    With `previous` (an earlier output), images whose content it already holds are not decoded again. The
    result is identical to a full preparation. If `out` already holds the same data version this is a no-op
    returning that manifest. `shard_bytes` bounds each shard's pixels; the data version does not depend on
    it (it hashes what the splits hold, not how they are cut into files).
    """
    raw, out = Path(raw), Path(out)
    split = split or SplitFractions()
    existing = existing_manifest(out, read_manifest)
    classes, paths = list_labelled_images(raw)
    images = sorted((fingerprint(path, path.parent.name) for path in paths), key=lambda image: image.key)
    previous_manifest, reusable = (None, _NOTHING) if previous is None else _reusable(Path(previous), size)
    pixels, decoded = _pixels(images, size, reusable)
    class_index = {name: index for index, name in enumerate(classes)}
    labels = np.array([class_index[image.class_name] for image in images], dtype=np.int64)
    keys = [image.key for image in images]
    arrays = _split(keys, labels, pixels, split, raw)
    files: dict[str, bytes] = {}
    entries = []
    for name in SPLIT_NAMES:
        split_payload, entry = split_files(name, arrays[name], shard_bytes)
        files.update(split_payload)
        entries.append(entry)
    mean, std = channel_statistics(arrays["train"].pixels)
    manifest = ImageManifest(
        size=size,
        classes=tuple(classes),
        split=split,
        raw_files=tuple(RawImageEntry(image.key, image.sha256, image.bytes) for image in images),
        splits=tuple(entries),
        channel_mean=mean,
        channel_std=std,
        stats=PrepStats(images=len(images), decoded=decoded, reused=len(images) - decoded),
        decoder=decoder_name(),
        previous_version=previous_manifest.data_version if previous_manifest else None,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    if existing is not None:
        return same_version_or_refuse(out, existing, manifest)
    publish(out, {**files, MANIFEST_NAME: manifest.to_json().encode()})
    log.info(
        "data version %s: %d images in %d classes at %dx%d; decoded %d, reused %d from the previous version",
        manifest.data_version, len(images), len(classes), size[0], size[1], decoded, len(images) - decoded,
    )  # fmt: skip
    return manifest


def _pixels(images: Sequence[RawImage], size: tuple[int, int], reusable: _Reusable) -> tuple[np.ndarray, int]:
    """uint8 [N, height, width, 3] for `images`, and how many had to be decoded."""
    pixels = np.empty((len(images), *size, 3), dtype=np.uint8)
    decoded = 0
    rejected, first = [], None
    copies: dict[str, list[tuple[int, int]]] = defaultdict(list)  # split -> (row here, row there)
    for row, image in enumerate(images):
        known = reusable.images.get(image.key)
        if known is not None and known.sha256 == image.sha256:
            copies[known.split].append((row, known.row))
            continue
        try:
            pixels[row] = decode_image(image.path, size)
        except InputError as error:  # that image costs itself: the others are prepared without it
            rejected.append(rejected_for(image.path, image.key, error))
            first = first or str(error)
        decoded += 1
    if rejected:
        raise RawFilesRejected(rejected, first)
    for name, pairs in copies.items():
        here, there = np.array(pairs, dtype=np.int64).T
        for start in range(0, len(pairs), _COPY_IMAGES):
            stored, _ = reusable.splits[name][there[start : start + _COPY_IMAGES]]
            pixels[here[start : start + _COPY_IMAGES]] = stored.numpy()
    return pixels, decoded


def _reusable(previous: Path, size: tuple[int, int]) -> tuple[ImageManifest | None, _Reusable]:
    """The previous version's manifest and what of it can be reused, or nothing to reuse, with a warning
    that says why."""
    if not previous.is_dir():
        raise InputError(
            f"--previous {escaped(previous)}: no such folder; expected an earlier prepared data version"
        )
    try:
        manifest = read_manifest(previous)
    except InputError as error:
        log.warning("not building on %s: %s; decoding every image", previous, error)
        return None, _NOTHING
    reason = None
    if manifest.size != size:
        reason = f"it was prepared at {manifest.size[0]}x{manifest.size[1]}, not {size[0]}x{size[1]}"
    elif manifest.decoder != decoder_name():
        reason = f"it was decoded by {manifest.decoder}, not {decoder_name()}"
    if reason is None:
        try:
            keys = {name: read_keys(previous, manifest, name) for name in SPLIT_NAMES}
            splits = {name: open_pixels(previous, manifest, name) for name in SPLIT_NAMES}
        except InputError as error:
            reason = f"its prepared files cannot be reused ({error})"
    if reason is not None:
        log.warning("not building on version %s: %s; decoding every image", manifest.data_version, reason)
        return manifest, _NOTHING
    hashes = {entry.key: entry.sha256 for entry in manifest.raw_files}
    images = {
        key: _Stored(hashes[key], name, row)
        for name in SPLIT_NAMES
        for row, key in enumerate(keys[name])
        if key in hashes
    }
    return manifest, _Reusable(images, splits)


def _split(
    keys: Sequence[str], labels: np.ndarray, pixels: np.ndarray, fractions: SplitFractions, raw: Path
) -> dict[str, SplitArrays]:
    assignment = assign_splits(keys, fractions)
    arrays = {}
    for index, name in enumerate(SPLIT_NAMES):
        rows = np.flatnonzero(assignment == index)
        if rows.size == 0:
            shown = ", ".join(f"{key}={value:g}" for key, value in fractions.as_dict().items())
            raise InputError(
                f"{escaped(raw)}: too few images: {len(keys)} images leave the {name} split empty with "
                f"fractions {shown}; expected more images (a few dozen at least) or other --split fractions"
            )
        arrays[name] = SplitArrays(
            keys=tuple(keys[row] for row in rows), labels=labels[rows], pixels=pixels[rows]
        )
    return arrays
