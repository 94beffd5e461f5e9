"""The register step's record: which candidate, evaluated how, from which trigger, data and job.

The record binds the evaluation to the candidate it claims to describe (same weights sha256, same data
version) before anything downstream may act on it, and carries the lineage a registered model version is
tagged with: trigger, raw and prepared data versions, pipeline job, code version and metrics.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from training.errors import InputError
from training.evaluate import EVALUATION_FILE, EVALUATION_FORMAT, read_json
from training.outputs import METADATA_FILE, write_atomically

log = logging.getLogger(__name__)

REGISTRATION_FILE = "registration.json"
REGISTRATION_FORMAT = "retrain-registration/1"


def _check_evaluation_matches(evaluation: dict[str, Any], metadata: dict[str, Any], where: Path) -> None:
    if evaluation.get("format") != EVALUATION_FORMAT:
        raise InputError(f"{where}: format {evaluation.get('format')!r}; expected {EVALUATION_FORMAT}")
    evaluated = evaluation.get("candidate", {}).get("weights_sha256")
    if evaluated != metadata.get("weights_sha256"):
        raise InputError(
            f"{where}: evaluates weights {str(evaluated)[:12]}, not this model's "
            f"{str(metadata.get('weights_sha256'))[:12]}; evaluate the model being registered"
        )
    if evaluation.get("data_version") != metadata.get("data_version"):
        raise InputError(f"{where}: evaluated on another data version than the model was trained on")


def registration_record(
    model_dir: Path, evaluation_dir: Path, model_name: str, trigger: str, pipeline_run: str | None
) -> dict[str, Any]:
    metadata = read_json(Path(model_dir) / METADATA_FILE, "the metadata.json a training writes")
    evaluation_path = Path(evaluation_dir) / EVALUATION_FILE
    evaluation = read_json(evaluation_path, "the evaluation.json the evaluate step writes")
    _check_evaluation_matches(evaluation, metadata, evaluation_path)
    return {
        "format": REGISTRATION_FORMAT,
        "model_name": model_name,
        "candidate": {
            "weights_sha256": metadata["weights_sha256"],
            "model_dir": str(Path(model_dir).resolve()),
            "mlflow_run_id": metadata.get("mlflow_run_id"),
        },
        "metrics": evaluation["metrics"],
        "lineage": {
            "trigger": trigger,
            "data_version": metadata["data_version"],
            "pipeline_run": pipeline_run,
            "code_version": metadata.get("code_version"),
            "torch_version": metadata.get("torch_version"),
            "steps": metadata.get("steps"),
            "evictions_survived": metadata.get("evictions_survived"),
        },
    }


def write_registration(
    model_dir: Path, evaluation_dir: Path, model_name: str, trigger: str, pipeline_run: str | None, out: Path
) -> dict[str, Any]:
    record = registration_record(model_dir, evaluation_dir, model_name, trigger, pipeline_run)
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    write_atomically(Path(out) / REGISTRATION_FILE, lambda handle: handle.write(text.encode()))
    log.info("recorded candidate %s of model %s", record["candidate"]["weights_sha256"][:12], model_name)
    return record
