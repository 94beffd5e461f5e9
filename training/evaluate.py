"""Score a trained candidate on the held-out test split of the data version it was trained on.

The evaluation is the evidence the registration gate reads: which weights (by their sha256), on which data
version and split, with which metrics. A candidate is only ever scored on its own data version's test split;
scoring it elsewhere would make its numbers incomparable with its training record.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.dataset import load_prepared
from training.errors import InputError
from training.model import ModelConfig, TabularClassifier
from training.outputs import (
    METADATA_FILE,
    MODEL_FILE,
    MODEL_FORMAT,
    classification_metrics,
    weights_sha256,
    write_atomically,
)

log = logging.getLogger(__name__)

EVALUATION_FILE = "evaluation.json"
EVALUATION_FORMAT = "retrain-evaluation/1"
EVALUATED_SPLIT = "test"


@dataclass(frozen=True)
class TrainedModel:
    model: TabularClassifier
    metadata: dict[str, Any]

    @property
    def weights_sha256(self) -> str:
        return str(self.metadata["weights_sha256"])


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; expected {what}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error.msg}); expected {what}") from None


def load_trained_model(model_dir: Path) -> TrainedModel:
    """Rebuild the model a training wrote, refusing weights that do not match their recorded sha256."""
    model_dir = Path(model_dir)
    metadata = read_json(model_dir / METADATA_FILE, "the metadata.json a training writes")
    try:
        payload = torch.load(model_dir / MODEL_FILE, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(f"{model_dir / MODEL_FILE}: no such file; expected a trained model folder") from None
    if not isinstance(payload, dict) or payload.get("format") != MODEL_FORMAT:
        raise InputError(
            f"{model_dir / MODEL_FILE}: not a {MODEL_FORMAT} file; expected a training's model.pt"
        )
    config = ModelConfig(**payload["model_config"])
    model = TabularClassifier(config, torch.zeros(config.n_features), torch.ones(config.n_features))
    model.load_state_dict(payload["state_dict"])
    model.eval()
    if weights_sha256(model) != metadata.get("weights_sha256"):
        raise InputError(f"{model_dir}: model.pt does not match the weights_sha256 in metadata.json")
    return TrainedModel(model, metadata)


def evaluate_candidate(model_dir: Path, data_dir: Path) -> dict[str, Any]:
    candidate = load_trained_model(model_dir)
    data = load_prepared(data_dir)
    if candidate.metadata.get("data_version") != data.data_version:
        raise InputError(
            f"--data {data_dir}: data version {data.data_version}, but the model was trained on "
            f"{candidate.metadata.get('data_version')}; evaluate on the data version it was trained on"
        )
    split = data.split(EVALUATED_SPLIT)
    with torch.no_grad():
        metrics = classification_metrics(candidate.model, split.features, split.labels)
    return {
        "format": EVALUATION_FORMAT,
        "candidate": {
            "weights_sha256": candidate.weights_sha256,
            "mlflow_run_id": candidate.metadata.get("mlflow_run_id"),
            "code_version": candidate.metadata.get("code_version"),
        },
        "data_version": data.data_version,
        "split": EVALUATED_SPLIT,
        "rows": len(split),
        "metrics": metrics,
    }


def write_evaluation(model_dir: Path, data_dir: Path, out: Path) -> dict[str, Any]:
    evaluation = evaluate_candidate(model_dir, data_dir)
    text = json.dumps(evaluation, indent=2, sort_keys=True) + "\n"
    write_atomically(Path(out) / EVALUATION_FILE, lambda handle: handle.write(text.encode()))
    log.info(
        "candidate %s on %s %s: accuracy %.4f, loss %.4f",
        evaluation["candidate"]["weights_sha256"][:12],
        evaluation["data_version"],
        EVALUATED_SPLIT,
        evaluation["metrics"]["accuracy"],
        evaluation["metrics"]["loss"],
    )
    return evaluation
