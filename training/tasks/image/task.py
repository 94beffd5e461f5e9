"""The built-in image task: classify images from the class-folder layout with a small CNN.

    RAW/<class name>/<file>.png|.jpg|.jpeg   ->   prepare (decode, resize, split)   ->   CNN   ->   class name

Options (keyword arguments; `[task.options]` in a model's configuration file):

- `size`: the side the images are resized to, 32 (square) or [height, width]; default 32. Images are
  always decoded as RGB (3 channels).
- `width`: the CNN's base channels (its blocks have width, 2*width and 4*width); default 32.
- `dropout`: the dropout before the classifier layer; default 0.1.
- `augment`: flip images left-right and move them by a few pixels while training; default true. The random
  numbers come from torch's default generator, which the engine reseeds every step, so resume stays exact.

A registered model answers a uint8 array N×H×W×3 (or one H×W×3 image) at the trained size with each
image's class folder name.

Training, evaluation and drift read the prepared shards (training/data/shards.py) a batch at a time: a
batch is gathered as uint8 pixels and scaled to the model's float32 input as it is read, the same values,
element for element, as scaling the whole split up front gave. A split beyond the shards' budget stays in
the page cache, which the ranks of a node share; what a rank allocates is a batch, not the split.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from core.errors import InputError
from core.metrics import BUILTIN_TASK_METRICS
from training.data.shards import ShardSplit
from training.data.splits import SPLIT_NAMES, SplitFractions
from training.tasks.base import FeatureTable, TaskData
from training.tasks.classification import metrics_from_logits
from training.tasks.image.features import prepared_features, raw_folder_features
from training.tasks.image.manifest import RERUN_HINT, open_pixels, read_manifest
from training.tasks.image.model import CnnConfig, ImageClassifier, InChunks, augment
from training.tasks.image.prepare import prepare_images
from training.tasks.image.raw_images import RAW_SUFFIXES, list_labelled_images

log = logging.getLogger(__name__)

DECLARED = BUILTIN_TASK_METRICS["image"]  # torch-free, where the front door reads it too
METRICS = DECLARED.metrics
MIN_SIDE, MAX_SIDE = 8, 1024
MAX_WIDTH = 256
EXAMPLE_IMAGES = 4


class ImageTask:
    """Image classification from `RAW/<class name>/<file>.png|.jpg|.jpeg` with a small CNN."""

    name = "image"
    raw_suffixes: tuple[str, ...] = RAW_SUFFIXES
    metrics = METRICS
    default_primary_metric = DECLARED.default_primary_metric

    def __init__(
        self, size: int | list[int] = 32, width: int = 32, dropout: float = 0.1, augment: bool = True
    ) -> None:
        self.size = _size(size)
        self.width = _whole("width", width, 1, MAX_WIDTH, "base channels", 32)
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout < 1.0:
            raise InputError(
                f"image task option dropout={dropout!r}: expected a probability in [0, 1), e.g. 0.1"
            )
        self.dropout = float(dropout)
        if not isinstance(augment, bool):
            raise InputError(f"image task option augment={augment!r}: expected true or false")
        self.augment = augment

    def options(self) -> Mapping[str, Any]:
        return {
            "size": list(self.size),
            "width": self.width,
            "dropout": self.dropout,
            "augment": self.augment,
        }

    def class_count(self, raw: Path | None) -> int | None:
        """The classes its per-class recalls cover: the class folders in `raw` with images, as preparing
        finds them; None without data, or when `raw` is not in the class-folder layout (prepare says why)."""
        if raw is None:
            return None
        try:
            return len(list_labelled_images(Path(raw))[0])
        except InputError:
            return None

    # -- data ----------------------------------------------------------------------------------------------

    def prepare(self, raw: Path, out: Path, *, previous: Path | None, split: SplitFractions) -> str:
        return prepare_images(raw, out, size=self.size, previous=previous, split=split).data_version

    def load(self, data_dir: Path) -> TaskData:
        data_dir = Path(data_dir)
        manifest = read_manifest(data_dir)
        if manifest.size != self.size:
            raise InputError(
                f"{data_dir}: images prepared at {_show(manifest.size)}, but the task's size is "
                f"{_show(self.size)}; set the image task option size={list(manifest.size)} or {RERUN_HINT}"
            )
        splits = {name: ImageSplit(open_pixels(data_dir, manifest, name)) for name in SPLIT_NAMES}
        counts = ", ".join(f"{name} {len(split)}" for name, split in splits.items())
        log.info("loaded image data version %s from %s: %s", manifest.data_version, data_dir, counts)
        info = {
            "size": list(manifest.size),
            "classes": list(manifest.classes),
            "channel_mean": list(manifest.channel_mean),
            "channel_std": list(manifest.channel_std),
        }
        return TaskData(data_version=manifest.data_version, splits=splits, info=info)

    # -- model ---------------------------------------------------------------------------------------------

    def build_model(self, info: Mapping[str, Any]) -> nn.Module:
        classes, mean, std = _classes(info), _triple(info, "channel_mean"), _triple(info, "channel_std")
        return ImageClassifier(CnnConfig(len(classes), self.width, self.dropout), mean, std)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        images, labels = batch
        if self.augment and model.training:
            images = augment(images)
        return nn.functional.cross_entropy(model(images), labels)

    def score(self, model: nn.Module, split: Any) -> dict[str, float]:
        """Every metric over the whole split, read and scored a chunk of images at a time (InChunks' chunks,
        so the model sees the batches it always did): what is held at once is one chunk's images and
        activations, and each image's logits. `model`'s mode is restored afterwards."""
        chunked = InChunks(model)
        was_training = model.training
        model.eval()
        logits, labels = [], []
        try:
            with torch.no_grad():
                for rows in torch.arange(len(split)).split(chunked.chunk):
                    images, targets = split[rows]
                    logits.append(chunked(images))
                    labels.append(targets)
        finally:
            model.train(was_training)
        return metrics_from_logits(torch.cat(logits), torch.cat(labels).to(chunked.device))

    # -- serving -------------------------------------------------------------------------------------------

    def input_example(self, data: TaskData) -> Any:
        test = data.split("test")
        inputs, _ = test[torch.arange(min(EXAMPLE_IMAGES, len(test)))]
        return inputs_to_pixels(inputs)

    def predict(self, model: nn.Module, info: Mapping[str, Any], inputs: Any) -> Any:
        classes = _classes(info)
        height, width = (int(side) for side in info["size"])
        pixels = _serving_pixels(inputs, height, width)
        with torch.no_grad():
            logits = InChunks(model)(pixels_to_inputs(pixels))
        return [classes[index] for index in logits.argmax(dim=1).tolist()]

    def drift_features(self, source: Path, *, prepared: bool) -> FeatureTable:
        return prepared_features(Path(source)) if prepared else raw_folder_features(Path(source), self.size)


class ImageSplit:
    """A split of image shards as the model takes it: `split[indices]` (the engine's 1-D tensor of
    global indices, or any index `ShardSplit` takes) is `(float32 [n, 3, H, W] in [0, 1], int64 [n])`;
    `split[i]` one image and its class."""

    def __init__(self, pixels: ShardSplit) -> None:
        self.pixels = pixels

    def __len__(self) -> int:
        return len(self.pixels)

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(index, int | np.integer):
            inputs, targets = self[[int(index)]]
            return inputs[0], targets[0]
        pixels, labels = self.pixels[index]
        return pixels_to_inputs(pixels), labels


def pixels_to_inputs(pixels: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 (or 0..255 float) [N, H, W, 3] -> the model's input, float32 [N, 3, H, W] scaled to [0, 1].
    Each value is its own float32 division by 255 on the CPU, so a batch scaled alone equals the same rows
    of the whole split scaled at once, bit for bit (a division by a scalar on the GPU may round otherwise)."""
    if not isinstance(pixels, torch.Tensor):
        pixels = torch.from_numpy(np.ascontiguousarray(pixels))
    # One pass lays the copy out channels-first as float32; the copy is always new, so dividing it in place
    # never touches the caller's array.
    channels_first = pixels.permute(0, 3, 1, 2)
    return channels_first.to(torch.float32, memory_format=torch.contiguous_format, copy=True).div_(255.0)


def inputs_to_pixels(inputs: torch.Tensor) -> np.ndarray:
    """The inverse of `pixels_to_inputs`: float32 [N, 3, H, W] in [0, 1] -> uint8 [N, H, W, 3]."""
    scaled = inputs.detach().cpu().permute(0, 2, 3, 1).mul(255.0).round().clamp(0, 255)
    return scaled.to(torch.uint8).numpy()


def _serving_pixels(inputs: Any, height: int, width: int) -> np.ndarray:
    expected = (
        f"expected a uint8 array of shape N×{height}×{width}×3 (or one {height}×{width}×3 image) "
        "with RGB values from 0 to 255"
    )
    if isinstance(inputs, torch.Tensor):
        inputs = inputs.detach().cpu().numpy()
    try:
        array = np.asarray(inputs)
    except (ValueError, TypeError) as error:
        raise InputError(f"image input: not an array ({error}); {expected}") from None
    if array.ndim == 3:
        array = array[np.newaxis]
    if array.ndim != 4 or array.shape[1:] != (height, width, 3) or array.shape[0] == 0:
        raise InputError(f"image input of shape {tuple(np.shape(inputs))}: {expected}")
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise InputError(f"image input of dtype {array.dtype}: {expected}")
    if not np.isfinite(array).all() or array.min() < 0 or array.max() > 255:
        raise InputError(f"image input with values outside 0..255: {expected}")
    return array.astype(np.float32, copy=False)


def _size(size: Any) -> tuple[int, int]:
    sides = list(size) if isinstance(size, list | tuple) else [size, size]
    valid = len(sides) == 2 and all(
        isinstance(side, int) and not isinstance(side, bool) and MIN_SIDE <= side <= MAX_SIDE
        for side in sides
    )
    if not valid:
        raise InputError(
            f"image task option size={size!r}: expected a whole number of pixels from {MIN_SIDE} to "
            f"{MAX_SIDE} or [height, width], e.g. 32 or [32, 48]"
        )
    return int(sides[0]), int(sides[1])


def _whole(name: str, value: Any, low: int, high: int, what: str, example: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(
            f"image task option {name}={value!r}: expected a whole number of {what} from {low} to {high}, "
            f"e.g. {example}"
        )
    return value


def _classes(info: Mapping[str, Any]) -> list[str]:
    classes = info.get("classes")
    if (
        not isinstance(classes, list | tuple)
        or len(classes) < 2
        or not all(isinstance(c, str) for c in classes)
    ):
        raise InputError(
            f"image model info: classes={classes!r}; expected the list of at least 2 class names that "
            "`load` returned"
        )
    return list(classes)


def _triple(info: Mapping[str, Any], key: str) -> list[float]:
    values = info.get(key)
    if (
        not isinstance(values, list | tuple)
        or len(values) != 3
        or not all(isinstance(value, int | float) and not isinstance(value, bool) for value in values)
    ):
        raise InputError(f"image model info: {key}={values!r}; expected 3 numbers, one per RGB channel")
    return [float(value) for value in values]


def _show(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"
