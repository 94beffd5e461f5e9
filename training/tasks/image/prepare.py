"""Prepare images: a class-folder tree of PNG/JPEG files in, one content-versioned data version out.

Everything happens in memory before anything is written: list and fingerprint every image, decode the ones
the previous version has not seen with the same content (the others' pixels come from its stored arrays;
an image that cannot be decoded is rejected, naming itself, and the others are prepared without it),
assign each image to a split by a salted hash of its key `<class>/<file name>` alone (so an image never
changes split as data grows), and build the manifest. Then `publish` writes the files, the manifest last.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from core.errors import InputError
from core.rejected_inputs import RawFilesRejected, rejected_for
from core.text import escaped
from training.data.publish import publish
from training.data.splits import SPLIT_NAMES, SplitFractions, assign_splits
from training.data.versions import existing_manifest, same_version_or_refuse
from training.tasks.image.manifest import (
    MANIFEST_NAME,
    ImageManifest,
    PrepStats,
    RawImageEntry,
    SplitArrays,
    channel_statistics,
    read_manifest,
    read_split,
    split_files,
)
from training.tasks.image.raw_images import RawImage, decode_image, fingerprint, list_labelled_images

log = logging.getLogger(__name__)


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
) -> ImageManifest:
    """Prepare the images under `raw` at `size` (height, width) as a data version in `out` (new or empty).

    With `previous` (an earlier output), images whose content it already holds are not decoded again. The
    result is identical to a full preparation. If `out` already holds the same data version this is a no-op
    returning that manifest.
    """
    raw, out = Path(raw), Path(out)
    split = split or SplitFractions()
    existing = existing_manifest(out, read_manifest)
    classes, paths = list_labelled_images(raw)
    images = sorted((fingerprint(path, path.parent.name) for path in paths), key=lambda image: image.key)
    previous_manifest, reusable = _reusable(Path(previous), size) if previous is not None else (None, {})
    pixels, decoded = _pixels(images, size, reusable)
    class_index = {name: index for index, name in enumerate(classes)}
    labels = np.array([class_index[image.class_name] for image in images], dtype=np.int64)
    keys = [image.key for image in images]
    arrays = _split(keys, labels, pixels, split, raw)
    files: dict[str, bytes] = {}
    entries = []
    for name in SPLIT_NAMES:
        split_payload, entry = split_files(name, arrays[name])
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


def _pixels(
    images: Sequence[RawImage], size: tuple[int, int], reusable: Mapping[str, tuple[str, np.ndarray]]
) -> tuple[np.ndarray, int]:
    """uint8 [N, height, width, 3] for `images`, and how many had to be decoded."""
    pixels = np.empty((len(images), *size, 3), dtype=np.uint8)
    decoded = 0
    rejected, first = [], None
    for row, image in enumerate(images):
        known = reusable.get(image.key)
        if known is not None and known[0] == image.sha256:
            pixels[row] = known[1]
            continue
        try:
            pixels[row] = decode_image(image.path, size)
        except InputError as error:  # that image costs itself: the others are prepared without it
            rejected.append(rejected_for(image.path, image.key, error))
            first = first or str(error)
        decoded += 1
    if rejected:
        raise RawFilesRejected(rejected, first)
    return pixels, decoded


def _reusable(
    previous: Path, size: tuple[int, int]
) -> tuple[ImageManifest | None, dict[str, tuple[str, np.ndarray]]]:
    """The previous version's manifest and {key: (raw sha256, pixels)}, or nothing to reuse, with a warning
    that says why."""
    if not previous.is_dir():
        raise InputError(
            f"--previous {escaped(previous)}: no such folder; expected an earlier prepared data version"
        )
    try:
        manifest = read_manifest(previous)
    except InputError as error:
        log.warning("not building on %s: %s; decoding every image", previous, error)
        return None, {}
    reason = None
    if manifest.size != size:
        reason = f"it was prepared at {manifest.size[0]}x{manifest.size[1]}, not {size[0]}x{size[1]}"
    elif manifest.decoder != decoder_name():
        reason = f"it was decoded by {manifest.decoder}, not {decoder_name()}"
    if reason is None:
        try:
            stored = [read_split(previous, manifest, name) for name in SPLIT_NAMES]
        except InputError as error:
            reason = f"its prepared files cannot be reused ({error})"
    if reason is not None:
        log.warning("not building on version %s: %s; decoding every image", manifest.data_version, reason)
        return manifest, {}
    hashes = {entry.key: entry.sha256 for entry in manifest.raw_files}
    reusable = {}
    for arrays in stored:
        for row, key in enumerate(arrays.keys):
            if key in hashes:
                reusable[key] = (hashes[key], arrays.pixels[row])
    return manifest, reusable


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
