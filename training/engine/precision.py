"""`--precision`: the arithmetic of a step's forward pass, and the gradient scaler float16 needs.

- `32`: float32 throughout.
- `bf16-mixed`: the forward pass (the task's `loss`) under bfloat16 autocast, on the CPU or CUDA. Weights,
  gradients and optimizer state stay float32; bfloat16 has float32's range, so no scaling is needed.
- `16-mixed`: float16 autocast with a `torch.amp.GradScaler`, CUDA only (refused on a CPU). float16's small
  range makes small gradients underflow, so the loss is multiplied by a scale before `backward`, and the
  gradients divided by it before clipping and the step. A step whose scaled gradients overflowed is skipped
  by the scaler (the weights are left as they were) and the scale halved: that is the scaler's ordinary
  working, not a divergence. The loss the trainer checks is the unscaled one, so only a loss or weights
  that are themselves non-finite stop the run (training/engine/divergence.py). The scaler's state (its scale
  and growth counter) is checkpointed and restored, so a resumed run scales exactly as an uninterrupted one.

Autocast is deterministic for a given device and inputs, so a mixed-precision run resumes bitwise too.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from core.errors import InputError

FULL, BF16_MIXED, FP16_MIXED = "32", "bf16-mixed", "16-mixed"


def require_supported(precision: str, device: torch.device) -> None:
    """Refuse float16 off CUDA: CPU float16 kernels are few and slow, and bfloat16 serves a CPU better."""
    if precision == FP16_MIXED and device.type != "cuda":
        raise InputError(
            f"--precision {FP16_MIXED}: float16 with a gradient scaler needs a CUDA device, and this "
            f"process trains on {device.type}; use --precision {BF16_MIXED} or 32 on a CPU"
        )


class Precision:
    """One attempt's precision on `device`: the autocast context, backward, and the (scaled) step. The
    trainer asks `require_supported` first; torch itself runs every combination."""

    def __init__(self, precision: str, device: torch.device) -> None:
        self.precision = precision
        self._device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type) if precision == FP16_MIXED else None
        self.skipped_steps = 0  # this attempt's float16 steps the scaler skipped

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision == FULL:
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == BF16_MIXED else torch.float16
        return torch.autocast(self._device_type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """The gradients as they are, before clipping reads their norm (float16's are scaled until here)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """The optimizer's step; False when the scaler skipped it (float16 gradients that overflowed)."""
        if self.scaler is None:
            optimizer.step()
            return True
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        stepped = self.scaler.get_scale() >= scale  # the scaler lowers its scale exactly when it skips
        if not stepped:
            self.skipped_steps += 1
        return stepped

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint keeps: the scaler's state, None without one."""
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
