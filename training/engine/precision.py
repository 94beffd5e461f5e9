"""`--precision`: the arithmetic of a step's forward pass, and the gradient scaler float16 needs.

- `32`: no autocast: every operation in the model's own dtype, float32 for the built-in tasks (a task's
  `build_model` may choose another, such as float64; what the parameters are is recorded as
  `parameter_dtype` in metadata.json's `optimization` and the MLflow run's parameters).
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

Both mixed precisions assume float32 parameters, and are refused before the first step for a model with
any other floating-point parameter (`require_applicable`): autocast leaves float64 operations in float64,
so `bf16-mixed` on a float64 model would change nothing while the run recorded bfloat16, and a model already
in bfloat16 or float16 has no float32 weights to keep (the scaler refuses float16 gradients outright).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from core.errors import InputError

FULL, BF16_MIXED, FP16_MIXED = "32", "bf16-mixed", "16-mixed"


def require_supported(precision: str, device: torch.device) -> None:
    """Refuse float16 off CUDA: CPU float16 kernels are few and slow, and bfloat16 serves a CPU better."""
    if precision == FP16_MIXED and device.type != "cuda":
        raise InputError(
            f"--precision {FP16_MIXED}: float16 with a gradient scaler needs a CUDA device, and this "
            f"process trains on {device.type}; use --precision {BF16_MIXED} or 32 on a CPU"
        )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _numeric(dtype: torch.dtype) -> bool:
    """A dtype whose values a precision is about: floating point or complex (not an integer buffer)."""
    return dtype.is_floating_point or dtype.is_complex


def parameter_dtype(model: nn.Module) -> str:
    """The dtypes of the model's floating-point (or complex) parameters, as recorded: 'float32', or
    'float32,float64' for a model partly in each."""
    dtypes = {_dtype_name(p.dtype) for p in model.parameters() if _numeric(p.dtype)}
    return ",".join(sorted(dtypes)) or "none"


def require_applicable(precision: str, model: nn.Module) -> None:
    """Refuse a mixed precision for a model whose floating-point parameters are not all float32, in one
    line naming the precision, the dtype and the parameters, and what to do: autocast casts float32
    operations only, and mixed precision keeps float32 weights."""
    if precision == FULL:
        return
    other = [
        (name, p.dtype)
        for name, p in model.named_parameters()
        if _numeric(p.dtype) and p.dtype != torch.float32
    ]
    if not other:
        return
    total = sum(1 for p in model.parameters() if _numeric(p.dtype))
    dtypes = " and ".join(sorted({_dtype_name(dtype) for _, dtype in other}))
    if any(dtype != torch.float64 for _, dtype in other):
        why = "mixed precision keeps float32 weights and computes below them"
    elif len(other) == total:
        why = "autocast leaves float64 operations in float64, so it would change nothing"
    else:
        why = "autocast leaves float64 operations in float64, so those would not run in lower precision"
    raise InputError(
        f"--precision {precision}: the model has {dtypes} parameters ({len(other)} of {total} tensors, first "
        f"{other[0][0]!r}), and {why}; build the model and its inputs in float32, or train with --precision "
        f"{FULL}"
    )


class Precision:
    """One attempt's precision on `device`: the autocast context, backward, and the (scaled) step. The
    trainer asks `require_supported` and `require_applicable` first; torch itself runs every combination."""

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
