"""Drift features of images: a few per-image statistics that move when the camera, the light or the framing
changes.

- `brightness`: mean luminance (ITU-R BT.601 weights) in [0, 1];
- `contrast`: the standard deviation of luminance;
- `mean_red`, `mean_green`, `mean_blue`: per-channel means in [0, 1];
- `centre_x`, `centre_y`: the centre of mass of luminance, as a fraction of the width and height (0 the
  left or top edge, 1 the right or bottom); 0.5 for an all-black image.

All are fractions of the image, not pixel counts, so an image's features hardly depend on the size it was
decoded at. A raw folder is decoded exactly as prepare decodes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from training.tasks.base import FeatureTable
from training.tasks.image.manifest import open_pixels, read_manifest
from training.tasks.image.raw_images import decode_image, list_any_images

FEATURE_NAMES = ("brightness", "contrast", "mean_red", "mean_green", "mean_blue", "centre_x", "centre_y")
LUMA_WEIGHTS = np.array([0.299, 0.587, 0.114])
_CHUNK = 1024  # images per pass, to bound the float64 copy


def image_features(pixels: np.ndarray) -> np.ndarray:
    """float64 [N, len(FEATURE_NAMES)] for uint8 pixels [N, height, width, 3]."""
    count, height, width, _ = pixels.shape
    rows = np.linspace(0.0, 1.0, height) if height > 1 else np.full(1, 0.5)
    columns = np.linspace(0.0, 1.0, width) if width > 1 else np.full(1, 0.5)
    features = np.empty((count, len(FEATURE_NAMES)), dtype=np.float64)
    for start in range(0, count, _CHUNK):
        scaled = pixels[start : start + _CHUNK].astype(np.float64) / 255.0
        luminance = scaled @ LUMA_WEIGHTS  # [n, height, width]
        mass = luminance.sum(axis=(1, 2))
        dark = mass <= 0.0
        safe_mass = np.where(dark, 1.0, mass)
        centre_x = np.where(dark, 0.5, luminance.sum(axis=1) @ columns / safe_mass)
        centre_y = np.where(dark, 0.5, luminance.sum(axis=2) @ rows / safe_mass)
        features[start : start + len(scaled)] = np.column_stack(
            [
                luminance.mean(axis=(1, 2)),
                luminance.std(axis=(1, 2)),
                scaled.mean(axis=(1, 2)),
                centre_x,
                centre_y,
            ]
        )
    return features


def raw_folder_features(raw: Path, size: tuple[int, int]) -> FeatureTable:
    """Features of every image under `raw` (in class folders or not), decoded at `size` as prepare does."""
    paths = list_any_images(Path(raw))
    pixels = np.stack([decode_image(path, size) for path in paths])
    return FeatureTable(FEATURE_NAMES, image_features(pixels))


def prepared_features(data_dir: Path) -> FeatureTable:
    """Features of a prepared data version's train split (checked against its manifest), read from its
    mapped shards `_CHUNK` images at a time: what is held is the features, not the pixels. The chunks are
    `image_features`' own, so the values are those of the split read whole."""
    data_dir = Path(data_dir)
    train = open_pixels(data_dir, read_manifest(data_dir), "train")
    parts = [image_features(train[rows][0].numpy()) for rows in torch.arange(len(train)).split(_CHUNK)]
    return FeatureTable(FEATURE_NAMES, np.concatenate(parts))
