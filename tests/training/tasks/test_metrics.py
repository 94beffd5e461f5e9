"""score_classifier agrees with scikit-learn on accuracy, macro-F1, loss and per-class recall."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score, log_loss, recall_score
from torch import nn

from training.gate.policy import non_finite
from training.tasks.classification import score_classifier

N_FEATURES, N_CLASSES = 6, 4


def small_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(N_FEATURES, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, N_CLASSES))


@pytest.fixture
def rows() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    features = torch.randn(300, N_FEATURES, generator=generator)
    labels = torch.randint(0, N_CLASSES, (300,), generator=generator)
    return features, labels


def sklearn_scores(model: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        logits = model(features)
    probabilities = torch.softmax(logits.double(), dim=1).numpy()
    predicted, actual = logits.argmax(dim=1).numpy(), labels.numpy()
    present = np.unique(actual)
    recalls = recall_score(actual, predicted, labels=present, average=None, zero_division=0)
    return {
        "accuracy": accuracy_score(actual, predicted),
        "macro_f1": f1_score(actual, predicted, average="macro"),
        "loss": log_loss(actual, probabilities, labels=list(range(N_CLASSES))),
        **{f"recall_{label}": recall for label, recall in zip(present.tolist(), recalls, strict=True)},
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_match_scikit_learn(seed: int, rows):
    features, labels = rows
    model = small_model(seed)
    ours = score_classifier(model, features, labels)
    theirs = sklearn_scores(model, features, labels)
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, abs=1e-5), name


def test_a_class_absent_from_the_labels_has_no_recall_but_counts_in_macro_f1_when_predicted(rows):
    features, labels = rows
    model = small_model(3)
    labels = torch.where(labels == 3, torch.zeros_like(labels), labels)  # no row of class 3 left
    ours = score_classifier(model, features, labels)
    assert "recall_3" not in ours
    with torch.no_grad():
        predicted = model.eval()(features).argmax(dim=1)
    assert (predicted == 3).any()  # the model still predicts 3, so F1 averages over it (as sklearn does)
    assert ours["macro_f1"] == pytest.approx(f1_score(labels.numpy(), predicted.numpy(), average="macro"))


def test_scoring_is_in_inference_mode_and_restores_the_models_mode(rows):
    features, labels = rows
    model = small_model(4).train()
    first = score_classifier(model, features, labels)
    assert model.training  # put back as it was
    assert score_classifier(model, features, labels) == first  # dropout was off: the same numbers again


def test_a_perfect_model_scores_one_everywhere():
    features = torch.eye(N_CLASSES)
    labels = torch.arange(N_CLASSES)
    model = nn.Linear(N_CLASSES, N_CLASSES)
    with torch.no_grad():
        model.weight.copy_(torch.eye(N_CLASSES) * 10)
        model.bias.zero_()
    scores = score_classifier(model, features, labels)
    assert scores["accuracy"] == scores["macro_f1"] == 1.0
    assert all(scores[f"recall_{label}"] == 1.0 for label in range(N_CLASSES))


def test_non_finite_names_every_unusable_value():
    metrics = {"a": 1.0, "b": math.nan, "c": math.inf, "d": "0.9", "e": True, "f": 3}
    assert non_finite(metrics) == ["b", "c", "d", "e"]
