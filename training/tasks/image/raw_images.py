"""Raw images: find them in the class-folder layout, fingerprint them, and decode one to a fixed size.

The layout is the one image tools agree on: `RAW/<class name>/<file>.png|.jpg|.jpeg`. Class names, sorted,
are the class indices. Hidden entries (a leading '.') are skipped, because writers use such names for files
still being written. Every image is decoded the same way, by `decode_image`, whether prepare or the drift
check reads it, so a feature means the same thing on both sides.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.errors import InputError
from core.files import file_sha256
from core.text import escaped

log = logging.getLogger(__name__)

RAW_SUFFIXES = (".png", ".jpg", ".jpeg")
LAYOUT = "RAW/<class name>/<file>.png|.jpg|.jpeg"
EXPECTED_IMAGE = "a PNG or JPEG image"
# The resize filter is part of the prepared data's format: another filter gives other pixels.
RESIZE_FILTER = "bilinear"
_REASON_LIMIT = 200


@dataclass(frozen=True)
class RawImage:
    """One raw image file: its key `<class>/<file name>`, its class folder and its content fingerprint."""

    path: Path
    class_name: str
    sha256: str
    bytes: int

    @property
    def key(self) -> str:
        return f"{self.class_name}/{self.path.name}"


def list_labelled_images(raw: Path) -> tuple[list[str], list[Path]]:
    """(class names sorted, image paths sorted by key) of a raw folder in the class-folder layout.

    An image directly in `raw`, a name that is not UTF-8, or fewer than two classes raise InputError.
    Class folders without any image are skipped with a warning (they name no examples yet).
    """
    folders, loose = _scan(raw)
    if loose:
        raise InputError(
            f"{escaped(loose[0])}: an image directly in the raw folder has no class; expected the layout "
            f"{LAYOUT}, e.g. move it into {escaped(raw)}/<class name>/"
        )
    classes: list[str] = []
    images: list[Path] = []
    for folder in folders:
        found = _images_in(folder)
        if not found:
            log.warning(
                "class folder %s holds no .png/.jpg/.jpeg images; it is not a class yet", escaped(folder)
            )
            continue
        classes.append(folder.name)
        images += found
    if len(classes) < 2:
        raise InputError(
            f"{escaped(raw)}: found {len(classes)} class folder(s) with images "
            f"({escaped(', '.join(classes)) or 'none'}); "
            f"expected at least 2 classes in the layout {LAYOUT}"
        )
    return classes, images


def list_any_images(raw: Path) -> list[Path]:
    """Every image in `raw` and its class folders, sorted: the drift check needs no labels, so images
    directly in `raw` count too."""
    folders, loose = _scan(raw)
    images = sorted(loose, key=lambda path: path.name)
    for folder in folders:
        images += _images_in(folder)
    if not images:
        raise InputError(f"{escaped(raw)}: holds no .png/.jpg/.jpeg images; expected the layout {LAYOUT}")
    return images


def _scan(raw: Path) -> tuple[list[Path], list[Path]]:
    """(class folders sorted by name, images directly in `raw`), after checking `raw` and the names."""
    if not raw.exists():
        raise InputError(f"{escaped(raw)}: the raw data folder does not exist; expected the layout {LAYOUT}")
    if not raw.is_dir():
        raise InputError(f"{escaped(raw)}: is not a folder; expected the layout {LAYOUT}")
    entries = [path for path in raw.iterdir() if not path.name.startswith(".")]
    for path in entries:
        _check_name(path)
    folders = sorted((path for path in entries if path.is_dir()), key=lambda path: path.name)
    files = [path for path in entries if path.is_file()]
    loose = [path for path in files if is_image_name(path.name)]
    ignored = sorted(path.name for path in files if not is_image_name(path.name))
    if ignored:
        log.info("ignoring %d files in %s that are not images: %s", len(ignored), raw, ignored)
    return folders, sorted(loose, key=lambda path: path.name)


def _images_in(folder: Path) -> list[Path]:
    entries = [path for path in folder.iterdir() if not path.name.startswith(".")]
    for path in entries:
        _check_name(path)
    images = [path for path in entries if path.is_file() and is_image_name(path.name)]
    ignored = sorted({path.name for path in entries} - {path.name for path in images})
    if ignored:
        log.info("ignoring %d entries in %s that are not image files: %s", len(ignored), folder, ignored)
    return sorted(images, key=lambda path: path.name)


def is_image_name(name: str) -> bool:
    return name.lower().endswith(RAW_SUFFIXES)


def _check_name(path: Path) -> None:
    """A name that is not UTF-8 cannot be a key (keys are hashed and stored as UTF-8 text)."""
    try:
        path.name.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path.name)
        raise InputError(
            f"{escaped(path.parent)}/{shown!r}: the name is not valid UTF-8; expected UTF-8 file and folder "
            f"names in the layout {LAYOUT}"
        ) from None


def fingerprint(path: Path, class_name: str) -> RawImage:
    return RawImage(path=path, class_name=class_name, sha256=file_sha256(path), bytes=path.stat().st_size)


def decode_image(path: Path, size: tuple[int, int]) -> np.ndarray:
    """The image at `path` as uint8 [height, width, 3] RGB at `size` (height, width); any problem is an
    InputError naming the file."""
    from PIL import Image, ImageOps, UnidentifiedImageError  # Pillow is needed only where images are read

    if path.stat().st_size == 0:
        raise InputError(f"{escaped(path)}: the file is empty (0 bytes); expected {EXPECTED_IMAGE}")
    height, width = size
    try:
        with Image.open(path) as image:
            image.load()
            # Phones store the camera's orientation in EXIF; the pixels people see are the rotated ones.
            upright = ImageOps.exif_transpose(image)
            rgb = upright.convert("RGB")
            resized = rgb.resize((width, height), Image.Resampling.BILINEAR)
    except Exception as error:  # a decoder fed arbitrary bytes fails in many ways; each is bad input
        if isinstance(error, UnidentifiedImageError):  # its message repeats the path
            reason = "its bytes are in no image format Pillow reads"
        else:
            reason = " ".join(str(error).split())[:_REASON_LIMIT] or type(error).__name__
        raise InputError(
            f"{escaped(path)}: not a readable image ({escaped(reason)}); expected {EXPECTED_IMAGE}"
        ) from error
    return np.asarray(resized, dtype=np.uint8).reshape(height, width, 3)
