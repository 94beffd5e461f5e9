"""The register step: the gate's decision, and for a candidate that passes, a new champion version.

The evaluation is bound to the candidate first (same weights sha256, same data version). Then, under the
registry lock, the step re-reads the champion: if it is not the version the evaluation scored, it loads that
one and scores it on the candidate's test split, so the gate never compares scores from different data or
against a stale champion. With a confidence, the gate holds the margin to the paired bootstrap the
evaluation recorded (the same resamples for both models); a champion that moved since is scored on the same
resamples (the recorded count and seed) before deciding. A candidate the gate accepts becomes a new
registered version with its lineage as tags; the old champion takes the alias `previous`, the new version
`champion`. A rejected candidate changes nothing in the registry. Either way the decision is tagged on the
candidate's training run (when it has one in this store) and written to registration.json.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.files import write_atomically
from core.names import check_model_name
from training.engine.outputs import METADATA_FILE, MODEL_FILE
from training.gate.bootstrap import (
    Resampling,
    paired_from_document,
    resampled_scores,
    resampling_from_document,
)
from training.gate.evaluate import (
    BOOTSTRAP,
    EVALUATED_SPLIT,
    EVALUATION_FILE,
    EVALUATION_FORMAT,
    TrainedModel,
    champion_document,
    champion_from_document,
    load_matching_data,
    load_trained_model,
    read_json,
    score_version,
    task_document,
)
from training.gate.lineage import (
    EVALUATED_ON,
    MANIFEST_FILE,
    REGISTERED_VERSION,
    REPLACED_VERSION,
    Lineage,
    Trigger,
    decision_tags,
    lineage_of,
    metric_tags,
)
from training.gate.lock import RegistryLock
from training.gate.policy import (
    Champion,
    Decision,
    GatePolicy,
    PairedScores,
    Scored,
    decide,
    policy_of,
)
from training.gate.pyfunc_model import ServedModel, served_example
from training.gate.registry import (
    CHAMPION,
    PREVIOUS,
    ModelRegistry,
    NewVersion,
    RegistryError,
    VersionInfo,
)
from training.tasks.base import TaskData

log = logging.getLogger(__name__)

REGISTRATION_FILE = "registration.json"
REGISTRATION_FORMAT = "retrain-registration/2"
FROM_EVALUATION, REREAD = "the evaluation", "re-read under the lock"
POLICY_SOURCE = "the gate policy of retrain register"


@dataclass(frozen=True)
class CheckedEvaluation:
    """The evaluate step's document, checked to score the model being registered, and where it was read.
    With the policy's confidence: what the evaluation resampled, and the paired scores it recorded (None
    when it had no champion to pair with)."""

    document: dict[str, Any]
    path: Path
    resampling: Resampling | None = None
    paired: PairedScores | None = None


@dataclass(frozen=True)
class Candidate:
    """A trained model, its evaluation, and the data it was evaluated on, checked to belong together, and
    the gate policy for its task."""

    trained: TrainedModel
    evaluation: CheckedEvaluation
    data: TaskData
    model_dir: Path
    policy: GatePolicy

    @property
    def scored(self) -> Scored:
        return Scored(
            self.evaluation.document["candidate"]["metrics"],
            self.evaluation.document["data_version"],
            self.trained.weights_sha256,
        )

    @property
    def run_id(self) -> str | None:
        return self.trained.metadata.get("mlflow_run_id")


@dataclass(frozen=True)
class RegisterRequest:
    model_dir: Path
    evaluation_dir: Path
    data_dir: Path
    model_name: str
    trigger: Trigger
    raw_data_version: str
    environment_version: str
    pipeline_job: str | None
    experiment: str
    # policy_for_task's keyword arguments as given (--primary-metric...); what is absent is the task's default
    gate: Mapping[str, Any] = field(default_factory=dict)
    task_ref: str | None = None  # None: the task model.pt records
    task_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        check_model_name(self.model_name, "--model-name")


def _check_evaluation(
    evaluation: dict[str, Any], trained: TrainedModel, model_name: str, where: Path
) -> None:
    if evaluation.get("format") != EVALUATION_FORMAT:
        raise InputError(
            f"{where}: format {evaluation.get('format')!r}; expected {EVALUATION_FORMAT} (re-run evaluate)"
        )
    try:
        evaluated = evaluation["candidate"]["weights_sha256"]
        evaluation["candidate"]["metrics"].items()
        champion_from_document(evaluation["champion"], evaluation["data_version"])
    except KeyError as error:
        raise InputError(f"{where}: incomplete evaluation (no {error}); re-run evaluate") from None
    except (TypeError, AttributeError, ValueError) as error:
        raise InputError(f"{where}: malformed evaluation ({error}); re-run evaluate") from None
    if evaluated != trained.weights_sha256:
        raise InputError(
            f"{where}: evaluates weights {str(evaluated)[:12]}, not this model's "
            f"{trained.weights_sha256[:12]}; evaluate the model being registered"
        )
    if evaluation["data_version"] != trained.metadata.get("data_version"):
        raise InputError(f"{where}: evaluated on another data version than the model was trained on")
    if evaluation.get("model_name") != model_name:
        raise InputError(
            f"{where}: compares with the champion of {evaluation.get('model_name')!r}, not of "
            f"{model_name!r}; evaluate with the same --model-name"
        )


def _recorded_bootstrap(
    evaluation: dict[str, Any], policy: GatePolicy, where: Path
) -> tuple[Resampling, PairedScores | None]:
    """The paired bootstrap the evaluation recorded, for a policy with a confidence: refused in one line
    when there is none, or it resampled another metric than the policy's primary one."""
    document = evaluation.get(BOOTSTRAP)
    if document is None:
        raise InputError(
            f"{where}: no paired bootstrap, which --confidence {policy.confidence:g} needs; evaluate with "
            "--confidence (and the same --primary-metric) first"
        )
    try:
        resampling = resampling_from_document(document)
        paired = paired_from_document(document, evaluation["rows"])
    except KeyError as error:
        raise InputError(f"{where}: incomplete bootstrap (no {error}); re-run evaluate") from None
    except (TypeError, AttributeError, ValueError, InputError) as error:
        raise InputError(f"{where}: malformed bootstrap ({error}); re-run evaluate") from None
    if resampling.metric != policy.primary_metric:
        raise InputError(
            f"{where}: the bootstrap resampled {resampling.metric}, but the gate's primary metric is "
            f"{policy.primary_metric}; evaluate with --primary-metric {policy.primary_metric}"
        )
    return resampling, paired


def load_candidate(request: RegisterRequest) -> Candidate:
    trained = load_trained_model(request.model_dir, request.task_ref, request.task_options)
    # First: a policy naming a metric the task does not report is refused before anything else is read.
    policy = policy_of(trained.task, **request.gate, where=POLICY_SOURCE)
    evaluation_path = Path(request.evaluation_dir) / EVALUATION_FILE
    evaluation = read_json(evaluation_path, "the evaluation.json the evaluate step writes")
    _check_evaluation(evaluation, trained, request.model_name, evaluation_path)
    resampling, paired = (
        _recorded_bootstrap(evaluation, policy, evaluation_path)
        if policy.confidence is not None
        else (None, None)
    )
    data = load_matching_data(trained, request.data_dir)
    checked = CheckedEvaluation(evaluation, evaluation_path, resampling, paired)
    return Candidate(trained, checked, data, Path(request.model_dir), policy)


def _current_champion(
    registry: ModelRegistry, candidate: Candidate, holder: VersionInfo | None
) -> tuple[Champion, str, PairedScores | None]:
    """The champion to decide against, where its scores came from, and with a confidence the paired
    scores against it."""
    evaluation = candidate.evaluation
    evaluated = evaluation.document["champion"]
    if (holder.version if holder else None) == evaluated["version"]:
        champion = champion_from_document(evaluated, evaluation.document["data_version"])
        return champion, FROM_EVALUATION, evaluation.paired
    if holder is None:  # the champion the evaluation scored is gone (a rollback removed it)
        return Champion.none(), REREAD, None
    log.info(
        "the champion moved from v%s to v%s since the evaluation; scoring v%s on the candidate's split",
        evaluated["version"],
        holder.version,
        holder.version,
    )
    split = candidate.data.split(EVALUATED_SPLIT)
    task, resampling = candidate.trained.task, evaluation.resampling
    champion, theirs = score_version(registry, holder, task, split, candidate.data.data_version, resampling)
    if resampling is None or theirs is None:
        return champion, REREAD, None
    # The candidate's values on the same resamples: recorded, unless the evaluation had no champion.
    mine = (
        evaluation.paired.candidate
        if evaluation.paired is not None
        else resampled_scores(task, candidate.trained.model, split, resampling)
    )
    return champion, REREAD, PairedScores(resampling.metric, resampling.seed, mine, theirs, len(split))


def _new_version(
    request: RegisterRequest, candidate: Candidate, lineage: Lineage, tags: dict[str, str]
) -> NewVersion:
    trained = candidate.trained
    manifest = Path(request.data_dir) / MANIFEST_FILE
    served = ServedModel(
        model_file=candidate.model_dir / MODEL_FILE,
        rebuilt=trained.rebuilt,
        task_file=trained.task_file,
        input_example=served_example(trained.task, candidate.data, request.data_dir),
        # Kept with the model, lineage reaches the data manifest even after the data folders are cleaned.
        extra_files=(
            *((manifest,) if manifest.is_file() else ()),
            candidate.evaluation.path,
            candidate.model_dir / METADATA_FILE,
        ),
        metadata={"retrain_task": task_document(trained), "retrain_weights_sha256": trained.weights_sha256},
    )
    return NewVersion(
        model_name=request.model_name,
        served=served,
        tags=tags,
        training_run_id=candidate.run_id,
        experiment=request.experiment,
        run_name=f"register {request.model_name} {trained.weights_sha256[:12]}",
        run_tags={"retrain.step": "register", **lineage.tags()},
    )


def register_candidate(
    request: RegisterRequest, registry: ModelRegistry, lock: RegistryLock
) -> dict[str, Any]:
    """Decide under the lock and, if accepted, register and promote. Returns the registration record."""
    candidate = load_candidate(request)
    lineage = lineage_of(
        request.data_dir,
        candidate.data.data_version,
        request.trigger,
        request.raw_data_version,
        request.environment_version,
        request.pipeline_job,
        candidate.trained.weights_sha256,
        candidate.run_id,
        task=task_document(candidate.trained),
    )
    with lock:
        holder = registry.alias_holder(request.model_name, CHAMPION)
        champion, basis, paired = _current_champion(registry, candidate, holder)
        metrics = candidate.trained.task.metrics
        decision = decide(candidate.scored, champion, candidate.policy, metrics, paired)
        registered = (
            _promote(request, registry, candidate, lineage, decision, holder) if decision.accepted else None
        )
    log.info("%s %s", request.model_name, decision.summary)
    return _record(request, candidate, lineage, decision, champion, basis, registered)


def _promote(
    request: RegisterRequest,
    registry: ModelRegistry,
    candidate: Candidate,
    lineage: Lineage,
    decision: Decision,
    holder: VersionInfo | None,
) -> VersionInfo:
    data = candidate.evaluation.document
    tags = {
        **lineage.tags(),
        **metric_tags(data["candidate"]["metrics"]),
        **decision_tags(decision.to_dict(), candidate.policy.describe()),
        EVALUATED_ON: f"{data['data_version']} {data['split']} ({data['rows']} rows)",
        REPLACED_VERSION: holder.version if holder else "none",
    }
    registered = registry.register(_new_version(request, candidate, lineage, tags))
    # `previous` first: a crash between the two leaves the old champion in place, not a stale `previous`.
    if holder is not None:
        registry.set_alias(request.model_name, PREVIOUS, holder.version)
    registry.set_alias(request.model_name, CHAMPION, registered.version)
    log.info(
        "%s v%s is the champion; previous: %s",
        request.model_name,
        registered.version,
        f"v{holder.version}" if holder else "none",
    )
    return registered


def _record(
    request: RegisterRequest,
    candidate: Candidate,
    lineage: Lineage,
    decision: Decision,
    champion: Champion,
    basis: str,
    registered: VersionInfo | None,
) -> dict[str, Any]:
    evaluation = candidate.evaluation.document
    return {
        "format": REGISTRATION_FORMAT,
        "model_name": request.model_name,
        "decision": {**decision.to_dict(), "policy": candidate.policy.describe()},
        "registered_version": registered.version if registered else None,
        "champion_compared": {**champion_document(champion), "scores_from": basis},
        "candidate": {
            "weights_sha256": candidate.trained.weights_sha256,
            "model_dir": str(candidate.model_dir.resolve()),
            "mlflow_run_id": candidate.run_id,
        },
        "metrics": evaluation["candidate"]["metrics"],
        "task": task_document(candidate.trained),
        "evaluated_on": {
            "data_version": evaluation["data_version"],
            "split": evaluation["split"],
            "rows": evaluation["rows"],
        },
        "lineage": lineage.to_dict(),
    }


def _tag_candidate_run(registry: ModelRegistry, record: dict[str, Any]) -> None:
    """The decision on the candidate's training run, when it has one in this store. The registry and
    registration.json already hold the outcome, so a failure here is reported, not fatal."""
    run_id = record["candidate"]["mlflow_run_id"]
    decision = record["decision"]
    tags = {
        **decision_tags(decision, decision["policy"]),
        REGISTERED_VERSION: record["registered_version"] or "none",
    }
    try:
        if registry.run_exists(run_id):
            registry.tag_run(str(run_id), tags)
    except RegistryError as error:
        log.warning("the decision is not on the candidate's run %s: %s", run_id, error)


def write_registration(
    request: RegisterRequest, registry: ModelRegistry, lock: RegistryLock, out: Path
) -> dict[str, Any]:
    record = register_candidate(request, registry, lock)
    text = json.dumps(record, indent=2, sort_keys=True, allow_nan=True) + "\n"
    write_atomically(Path(out) / REGISTRATION_FILE, lambda handle: handle.write(text.encode()))
    _tag_candidate_run(registry, record)
    return record
