"""Sample images: a "shapes" data set drawn from a seed, written as PNGs in class folders.

Four classes, `circle`, `cross`, `square` and `triangle`, each a filled shape of a random colour, size and
position on a noisy, tinted background. It stands in for the labelled images that land in Blob Storage,
so the image task's whole loop runs with no download, and a small CNN learns it to high accuracy within a
short CPU run. `shift` draws a drifted batch: brighter images whose shapes sit further right and down, as a
changed camera or lighting would deliver them.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np

from core.errors import InputError

SHAPES = ("circle", "cross", "square", "triangle")
DEFAULT_SIDE = 32
BRIGHTEN = 0.3  # what shift=1 adds to every pixel (values in [0, 1])
MOVE = 0.6  # with shift=1, shapes sit in the right and bottom 40% of the positions they could take


def write_sample_images(
    out: Path, per_class: int, seed: int, shift: float = 0.0, *, side: int = DEFAULT_SIDE
) -> list[Path]:
    """Write `per_class` PNGs of each shape into `out/<shape>/<shape>-s<seed>-<n>.png`; return their paths.

    The same arguments always draw the same images; different seeds give different file names, so batches
    can be added to one folder. Existing files are never overwritten (that raises InputError), and each file
    appears whole (written under a hidden name, then renamed), so a watcher never sees a partial image.
    """
    from PIL import Image  # Pillow is needed only where images are written

    out = Path(out)
    _check(per_class, seed, shift, side)
    rng = np.random.default_rng(seed)
    planned = [
        (shape, out / shape / f"{shape}-s{seed}-{number:04d}.png")
        for shape in SHAPES
        for number in range(per_class)
    ]
    for _, path in planned:
        if path.exists():
            raise InputError(f"{path}: already exists; sample images are never overwritten, use another seed")
    for shape in SHAPES:
        (out / shape).mkdir(parents=True, exist_ok=True)
    for shape, path in planned:
        pixels = draw_shape(shape, rng, shift, side)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
        try:
            Image.fromarray(pixels).save(temporary, format="PNG")
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    return [path for _, path in planned]


def draw_shape(
    shape: str, rng: np.random.Generator, shift: float = 0.0, side: int = DEFAULT_SIDE
) -> np.ndarray:
    """One uint8 [side, side, 3] image of `shape`, its randomness drawn from `rng`."""
    background = rng.uniform(0.1, 0.4) + rng.uniform(-0.05, 0.05, size=3)
    image = background + rng.normal(0.0, 0.06, size=(side, side, 3))
    colour = rng.uniform(0.55, 1.0, size=3)
    radius = rng.uniform(0.24, 0.36) * side
    free = side - 2 * radius  # the span the centre can take with the shape wholly inside
    start = MOVE * shift  # a drifted batch draws positions from the far end of that span
    centre_x = radius + free * (start + (1 - start) * rng.uniform())
    centre_y = radius + free * (start + (1 - start) * rng.uniform())
    rows, columns = np.mgrid[0:side, 0:side] + 0.5
    image[_mask(shape, columns - centre_x, rows - centre_y, radius)] = colour
    image += BRIGHTEN * shift
    return np.clip(np.round(image * 255.0), 0, 255).astype(np.uint8)


def _mask(shape: str, dx: np.ndarray, dy: np.ndarray, radius: float) -> np.ndarray:
    if shape == "circle":
        return dx**2 + dy**2 <= radius**2
    if shape == "square":
        return (np.abs(dx) <= 0.8 * radius) & (np.abs(dy) <= 0.8 * radius)
    if shape == "cross":
        arm = 0.3 * radius
        inside = (np.abs(dx) <= radius) & (np.abs(dy) <= radius)
        return inside & ((np.abs(dx) <= arm) | (np.abs(dy) <= arm))
    if shape == "triangle":
        depth = (dy + radius) / (1.8 * radius)  # 0 at the apex, 1 at the base
        return (depth >= 0) & (depth <= 1) & (np.abs(dx) <= radius * depth)
    raise InputError(f"shape {shape!r}: expected one of {', '.join(SHAPES)}")


def _check(per_class: int, seed: int, shift: float, side: int) -> None:
    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not whole(per_class) or per_class < 1:
        raise InputError(f"per_class={per_class!r}: expected a whole number of images per class, at least 1")
    if not whole(seed) or seed < 0:
        raise InputError(f"seed={seed!r}: expected a whole number, at least 0")
    if isinstance(shift, bool) or not isinstance(shift, int | float) or not 0.0 <= shift <= 1.0:
        raise InputError(f"shift={shift!r}: expected a strength from 0 to 1")
    if not whole(side) or not 8 <= side <= 1024:
        raise InputError(f"side={side!r}: expected a whole number of pixels from 8 to 1024")
