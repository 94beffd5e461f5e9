"""How a classifier is scored: accuracy, macro-F1, cross-entropy loss and per-class recall.

One function scores any classifier on one split, so a candidate's and a champion's numbers come from the
same code on the same rows. Per-class recall is keyed `recall_<label index>`; a class absent from the
split has no recall (not a perfect one), and macro-F1 averages over the classes present in the labels or
the predictions.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from core.metrics import BUILTIN_TASK_METRICS, RECALL_PREFIX

# The tabular task's declaration (core/metrics.py): the classifier's metrics.
CLASSIFICATION_METRICS = BUILTIN_TASK_METRICS["tabular"].metrics


@torch.no_grad()
def score_classifier(model: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Every classification metric of `model` on one split (its mode is restored afterwards)."""
    was_training = model.training
    model.eval()
    try:
        logits = model(features)
    finally:
        model.train(was_training)
    return metrics_from_logits(logits, labels)


def metrics_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    loss = nn.functional.cross_entropy(logits, labels).item()
    return metrics_from_predictions(logits.argmax(dim=1), labels, loss)


def metrics_from_predictions(
    predictions: torch.Tensor, labels: torch.Tensor, loss: float
) -> dict[str, float]:
    """The metrics of each row's predicted class against its label, with the split's mean `loss` (a split
    scored in batches sums each batch's loss and divides once)."""
    metrics = {"accuracy": (predictions == labels).float().mean().item(), "loss": loss}
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
