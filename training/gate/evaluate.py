"""Score the candidate and the current champion on the same held-out test split, the candidate's own.

The evaluation is the evidence the registration gate reads: which weights (by their sha256), on which data
version and split, with which metrics, for the candidate and for the version holding the `champion` alias
(or why there is none to compare with: no champion yet, or one that cannot be loaded). Both are scored by
the same function on the same rows, so their numbers are comparable by construction. No policy applies
here; the gate decides at registration.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.common import write_atomically
from training.engine.outputs import METADATA_FILE, MODEL_FILE, MODEL_FORMAT, weights_sha256
from training.errors import InputError
from training.gate.metrics import score_classifier
from training.gate.policy import LOADED, NO_CHAMPION, UNLOADABLE, Champion, Scored
from training.gate.registry import (
    CHAMPION,
    ModelLoadError,
    ModelRegistry,
    RegistryError,
    VersionInfo,
    check_model_name,
)
from training.tasks.tabular.dataset import PreparedData, SplitData, load_prepared
from training.tasks.tabular.model import ModelConfig, TabularClassifier

log = logging.getLogger(__name__)

EVALUATION_FILE = "evaluation.json"
EVALUATION_FORMAT = "retrain-evaluation/2"
EVALUATED_SPLIT = "test"
RUN_METRIC_PREFIX = "test_"


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


def load_matching_data(candidate: TrainedModel, data_dir: Path) -> PreparedData:
    """The prepared data version the candidate was trained on; any other is refused."""
    data = load_prepared(data_dir)
    if candidate.metadata.get("data_version") != data.data_version:
        raise InputError(
            f"--data {data_dir}: data version {data.data_version}, but the model was trained on "
            f"{candidate.metadata.get('data_version')}; evaluate on the data version it was trained on"
        )
    return data


def score_version(
    registry: ModelRegistry, holder: VersionInfo, split: SplitData, data_version: str
) -> Champion:
    """A registered version scored on `split`; unloadable (with the reason) when it cannot be loaded."""
    try:
        model = registry.load_model(holder)
    except ModelLoadError as error:
        log.warning("champion %s is unloadable: %s", holder.uri, error)
        return Champion.unloadable(holder.version, str(error))
    metrics = score_classifier(model, split.features, split.labels)
    return Champion.loaded(holder.version, Scored(metrics, data_version, str(holder.weights_sha256)))


def champion_document(champion: Champion) -> dict[str, Any]:
    scored = champion.scored
    return {
        "state": champion.state,
        "version": champion.version,
        "weights_sha256": scored.weights_sha256 if scored else None,
        "metrics": dict(scored.metrics) if scored else None,
        "error": champion.error,
    }


def champion_from_document(document: dict[str, Any], data_version: str) -> Champion:
    """The champion an evaluation recorded, scored on `data_version` (the evaluation's own).

    Raises KeyError for a missing field, ValueError or TypeError for one of the wrong form.
    """
    state = document["state"]
    if state == LOADED:
        scored = Scored(dict(document["metrics"]), data_version, str(document["weights_sha256"]))
        return Champion.loaded(str(document["version"]), scored)
    if state == UNLOADABLE:
        return Champion.unloadable(str(document["version"]), str(document["error"]))
    if state == NO_CHAMPION and document["version"] is None:
        return Champion.none()
    raise ValueError(f"champion state {state!r} with version {document['version']!r}")


def evaluate(model_dir: Path, data_dir: Path, model_name: str, registry: ModelRegistry) -> dict[str, Any]:
    check_model_name(model_name)
    candidate = load_trained_model(model_dir)
    data = load_matching_data(candidate, data_dir)
    split = data.split(EVALUATED_SPLIT)
    metrics = score_classifier(candidate.model, split.features, split.labels)
    holder = registry.alias_holder(model_name, CHAMPION)
    champion = (
        Champion.none() if holder is None else score_version(registry, holder, split, data.data_version)
    )
    return {
        "format": EVALUATION_FORMAT,
        "model_name": model_name,
        "data_version": data.data_version,
        "split": EVALUATED_SPLIT,
        "rows": len(split),
        "candidate": {
            "weights_sha256": candidate.weights_sha256,
            "mlflow_run_id": candidate.metadata.get("mlflow_run_id"),
            "code_version": candidate.metadata.get("code_version"),
            "metrics": metrics,
        },
        "champion": champion_document(champion),
    }


def write_evaluation(
    model_dir: Path, data_dir: Path, model_name: str, registry: ModelRegistry, out: Path
) -> dict[str, Any]:
    """Evaluate, write evaluation.json, and log the candidate's test metrics and the file to its run."""
    evaluation = evaluate(model_dir, data_dir, model_name, registry)
    path = Path(out) / EVALUATION_FILE
    text = json.dumps(evaluation, indent=2, sort_keys=True) + "\n"
    write_atomically(path, lambda handle: handle.write(text.encode()))
    candidate, champion = evaluation["candidate"], evaluation["champion"]
    _log_to_candidate_run(registry, candidate, path)
    log.info(
        "candidate %s on %s %s: macro-F1 %.4f, accuracy %.4f; champion: %s",
        candidate["weights_sha256"][:12],
        evaluation["data_version"],
        EVALUATED_SPLIT,
        candidate["metrics"]["macro_f1"],
        candidate["metrics"]["accuracy"],
        _describe_champion(champion),
    )
    return evaluation


def _log_to_candidate_run(registry: ModelRegistry, candidate: dict[str, Any], path: Path) -> None:
    """The candidate's test scores and evaluation.json on its training run, when it has one in this store.
    The evaluation file is the evidence the gate reads, so a failure here is reported, not fatal."""
    run_id = candidate["mlflow_run_id"]
    metrics = {f"{RUN_METRIC_PREFIX}{name}": value for name, value in candidate["metrics"].items()}
    try:
        if registry.run_exists(run_id):
            registry.log_run_results(run_id, metrics, [path])
            return
    except RegistryError as error:
        log.warning("the evaluation is not on the candidate's run %s: %s", run_id, error)
        return
    log.info("the candidate has no MLflow run in this store; its evaluation is in %s only", path)


def _describe_champion(champion: dict[str, Any]) -> str:
    if champion["state"] == LOADED:
        return f"v{champion['version']} macro-F1 {champion['metrics']['macro_f1']:.4f}"
    if champion["version"] is None:
        return "none yet"
    return f"v{champion['version']} {champion['state']} ({champion['error']})"
