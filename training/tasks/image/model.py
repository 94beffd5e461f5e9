"""The image classifier: a small CNN that carries its own input normalisation, and the augmentation.

The model takes pixels scaled to [0, 1] as float32 [N, 3, height, width]; the train split's per-channel
mean and standard deviation live in it as buffers, so a saved or registered model needs no separate
preprocessing artefact. Three conv blocks (channels width, 2*width, 4*width, each halving the resolution)
end in a global average pool, so the same weights run at any input size of at least 8x8.

BatchNorm, because on the sample shapes it learns within two epochs where GroupNorm or no normalisation
need ten or more. Its running statistics are buffers: they are in every checkpoint (so resume stays exact),
DDP broadcasts rank 0's before each forward pass, and evaluation and serving use them, so an image's answer
does not depend on the batch it comes in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn

from core.errors import InputError

# A channel (near-)constant in the training split gets std 1: dividing by a tiny std would blow up any value
# it takes elsewhere, while 1 leaves it merely centred.
CONSTANT_STD_BELOW = 1e-6
MAX_SHIFT_FRACTION = 0.125  # augmentation moves an image by up to 1/8 of its side (4 pixels at 32)


@dataclass(frozen=True)
class CnnConfig:
    n_classes: int
    width: int = 32
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.n_classes < 2:
            raise InputError(
                f"the image model needs at least 2 classes, got {self.n_classes}; check the prepared data"
            )

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)


def _block(channels_in: int, channels_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class ImageClassifier(nn.Module):
    def __init__(
        self, config: CnnConfig, channel_mean: Sequence[float], channel_std: Sequence[float]
    ) -> None:
        super().__init__()
        self.config = config
        mean = torch.tensor(list(channel_mean), dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(list(channel_std), dtype=torch.float32).view(1, 3, 1, 1)
        self.register_buffer("channel_mean", mean)
        self.register_buffer("channel_std", torch.where(std < CONSTANT_STD_BELOW, torch.ones_like(std), std))
        width = config.width
        self.features = nn.Sequential(
            _block(3, width), _block(width, 2 * width), _block(2 * width, 4 * width)
        )
        self.head = nn.Sequential(nn.Dropout(config.dropout), nn.Linear(4 * width, config.n_classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.features((images - self.channel_mean) / self.channel_std)
        # The global average pool as a mean: AdaptiveAvgPool2d's CUDA backward has no deterministic
        # implementation, so `--deterministic` (torch.use_deterministic_algorithms) would refuse it.
        return self.head(features.mean(dim=(2, 3)))


def augment(images: torch.Tensor) -> torch.Tensor:
    """Each image of a [N, 3, H, W] batch flipped left-right with probability 1/2 and moved by a few pixels
    (edges repeated). Random numbers come only from torch's default generator, which the engine reseeds
    before every step, so a resumed run draws the same ones."""
    count, _, height, width = images.shape
    device = images.device
    flip = torch.rand(count, device=device) < 0.5
    images = torch.where(flip.view(count, 1, 1, 1), images.flip(3), images)
    reach = max(1, round(MAX_SHIFT_FRACTION * min(height, width)))
    offsets = torch.randint(
        0, 2 * reach + 1, (count, 2), device=device
    )  # top-left corner in the padded image
    padded = nn.functional.pad(images, (reach, reach, reach, reach), mode="replicate")
    rows = (offsets[:, 0:1] + torch.arange(height, device=device)).view(count, 1, height, 1)
    columns = (offsets[:, 1:2] + torch.arange(width, device=device)).view(count, 1, 1, width)
    batch = torch.arange(count, device=device).view(count, 1, 1, 1)
    channels = torch.arange(images.shape[1], device=device).view(1, -1, 1, 1)
    return padded[batch, channels, rows, columns]


class InChunks(nn.Module):
    """Runs a model over a large input a chunk at a time, each moved to the model's device, and joins the
    outputs: scoring a whole split at once would hold every image's activations in memory together."""

    def __init__(self, model: nn.Module, chunk: int = 512) -> None:
        super().__init__()
        self.model = model
        self.chunk = chunk
        # Mirror the wrapped model's mode: whoever toggles this wrapper restores what it found.
        self.training = model.training

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        device = self.device
        return torch.cat([self.model(part.to(device)) for part in torch.split(images, self.chunk)])
