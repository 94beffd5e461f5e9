"""The paired bootstrap behind the gate's confidence: a model's primary metric on resamples of the test split.

On a small test set one example moves a metric by more than the gate's margin (1/314 = 0.0032), so a
candidate can beat the champion by chance. Resampling the test split with replacement, and scoring both
models on the *same* resamples, measures how much of an improvement is noise: the gate (policy.py) takes
the lower bound of the improvements at its confidence.

Scoring goes through the task's own `score(model, split)` on each resampled split, the only contract a task
keeps, so every task's metrics resample as they are (a macro-F1 is recomputed, not averaged). A
`TensorSplit` is resampled by one gather per tensor; any other map-style split is seen through its
resampled indices (`ResampledSplit`). Resample `i` is the same rows for every model: the indices come from a
generator seeded with `seed` alone, drawn in order, so recording (resamples, seed) makes the evidence, and
the decision on it, reproducible.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from core.errors import InputError
from training.engine.outputs import scores
from training.gate.options import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from training.gate.policy import PairedScores
from training.tasks.base import Task, TensorSplit


@dataclass(frozen=True)
class Resampling:
    """Which metric to resample, how many resamples, and the seed they are drawn from."""

    metric: str
    resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = BOOTSTRAP_SEED

    def __post_init__(self) -> None:
        if isinstance(self.resamples, bool) or not isinstance(self.resamples, int) or self.resamples < 1:
            raise InputError(f"--bootstrap-resamples {self.resamples!r}: expected a whole number >= 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InputError(f"--bootstrap-seed {self.seed!r}: expected a whole number >= 0")

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "resamples": self.resamples, "seed": self.seed}


def resample_indices(size: int, resamples: int, seed: int) -> Iterator[torch.Tensor]:
    """`resamples` draws of `size` row indices with replacement, the same for the same (size, seed): a
    generator of its own, so nothing else's randomness moves them."""
    if size < 1:
        raise InputError("the test split is empty; there is nothing to resample")
    generator = torch.Generator().manual_seed(seed)
    for _ in range(resamples):
        yield torch.randint(0, size, (size,), generator=generator)


class ResampledSplit:
    """A map-style split seen through resampled indices: item `i` is the base split's item `indices[i]`.

    An index is passed on in the kind it came: an `int` as an `int` (a split that takes only ints), a
    tensor of indices as a tensor (a split that returns a batch for one), so the task's `score` reads it
    exactly as it reads its own split."""

    def __init__(self, base: Any, indices: torch.Tensor) -> None:
        self.base = base
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            index = torch.arange(len(self.indices))[index]
        if isinstance(index, torch.Tensor) and index.dim() > 0:
            return self.base[self.indices[index]]
        if isinstance(index, list | np.ndarray):
            return self.base[self.indices[torch.as_tensor(index, dtype=torch.long)]]
        return self.base[int(self.indices[int(index)])]  # out of range: IndexError, which ends iteration


def resampled(split: Any, indices: torch.Tensor) -> Any:
    """`split` with rows `indices`: a TensorSplit (or a subclass, copied) gathered, any other wrapped."""
    if isinstance(split, TensorSplit):
        copied = copy.copy(split)
        copied.inputs = split.inputs[indices]
        copied.targets = split.targets[indices]
        copied.keys = [split.keys[i] for i in indices.tolist()] if split.keys else []
        return copied
    return ResampledSplit(split, indices)


def resampled_scores(task: Task, model: nn.Module, split: Any, resampling: Resampling) -> tuple[float, ...]:
    """`model`'s `resampling.metric` on each resample of `split`, in order, scored by `task`."""
    values = []
    for indices in resample_indices(len(split), resampling.resamples, resampling.seed):
        found = scores(task, model, resampled(split, indices))
        if resampling.metric not in found:
            raise InputError(
                f"task {task.name!r}: score() on a resampled split gave no {resampling.metric!r}; "
                "expected the metrics it gives on the whole split"
            )
        values.append(found[resampling.metric])
    return tuple(values)


def paired_document(resampling: Resampling, paired: PairedScores | None) -> dict[str, Any]:
    """The bootstrap as evaluation.json records it: what was resampled, and each model's values (null
    when there was no champion to pair the candidate with)."""
    return {
        **resampling.to_dict(),
        "candidate": list(paired.candidate) if paired else None,
        "champion": list(paired.champion) if paired else None,
    }


def resampling_from_document(document: dict[str, Any]) -> Resampling:
    """Raises KeyError for a missing field, InputError, ValueError or TypeError for a wrong one."""
    return Resampling(str(document["metric"]), document["resamples"], document["seed"])


def paired_from_document(document: dict[str, Any], rows: int) -> PairedScores | None:
    """The recorded paired scores on resamples of a split of `rows` rows (the evaluation's), or None when
    the evaluation had no champion to pair with. Raises KeyError, ValueError or TypeError for a malformed
    record, including values that are not `resamples` many."""
    resampling = resampling_from_document(document)
    if document["candidate"] is None or document["champion"] is None:
        return None
    candidate, champion = document["candidate"], document["champion"]
    paired = PairedScores(resampling.metric, resampling.seed, candidate, champion, rows)
    if paired.resamples != resampling.resamples:
        raise ValueError(f"{paired.resamples} paired values, but {resampling.resamples} resamples recorded")
    return paired
