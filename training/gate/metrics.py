"""The scores a candidate and a champion are compared on: accuracy, macro-F1, loss and per-class recall.

One function scores any classifier on one split, so candidate and champion numbers come from the same code
on the same rows. Per-class recall is keyed `recall_<label>`; a class absent from the split has no recall
(not a perfect one), and macro-F1 averages over the classes present in the labels or the predictions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

PRIMARY_CANDIDATES = ("accuracy", "macro_f1", "loss")
LOWER_IS_BETTER = frozenset({"loss"})
RECALL_PREFIX = "recall_"


def higher_is_better(metric: str) -> bool:
    return metric not in LOWER_IS_BETTER


@torch.no_grad()
def score_classifier(model: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    was_training = model.training
    model.eval()
    try:
        logits = model(features)
    finally:
        model.train(was_training)
    predictions = logits.argmax(dim=1)
    metrics = {
        "accuracy": (predictions == labels).float().mean().item(),
        "loss": nn.functional.cross_entropy(logits, labels).item(),
    }
    f1_scores = []
    for label in torch.unique(torch.cat([labels, predictions])).tolist():
        actual, predicted = labels == label, predictions == label
        true_positives = (actual & predicted).sum().item()
        if actual.any():
            metrics[f"{RECALL_PREFIX}{label}"] = true_positives / actual.sum().item()
        denominator = actual.sum().item() + predicted.sum().item()
        f1_scores.append(2 * true_positives / denominator if denominator else 0.0)
    metrics["macro_f1"] = sum(f1_scores) / len(f1_scores) if f1_scores else math.nan
    return metrics


def non_finite(metrics: Mapping[str, float]) -> list[str]:
    """Names of metrics whose value is NaN, infinite or not a number at all."""
    bad = []
    for name, value in metrics.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            bad.append(name)
    return sorted(bad)
