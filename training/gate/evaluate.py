"""Score the candidate and the current champion on the same held-out test split, the candidate's own.

The evaluation is the evidence the registration gate reads: which weights (by their sha256), on which data
version and split, with which metrics, for the candidate and for the version holding the `champion` alias
(or why there is none to compare with: no champion yet, or one that cannot be loaded). Both are scored by
the same function on the same rows, so their numbers are comparable by construction. No policy applies
here; the gate decides at registration.

With the gate's confidence, both are also scored on the same resamples of the split (bootstrap.py): the
primary metric's values per resample, the number of resamples and their seed go into the evaluation as
`bootstrap`, from which the register step takes the interval at its confidence. Without one, the
evaluation is what it always was.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from core.errors import InputError
from core.files import write_atomically
from core.gate_rules import AS_FLAGS, resampling_conflict
from core.names import check_model_name
from core.secrets import MASK
from core.task_ref import options_text, parse_task_ref, secret_options, written_options
from training.engine.outputs import METADATA_FILE, MODEL_FILE, read_model_payload, scores, weights_sha256
from training.gate.bootstrap import Resampling, paired_document, resampled_scores
from training.gate.options import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from training.gate.policy import (
    LOADED,
    NO_CHAMPION,
    UNLOADABLE,
    Champion,
    PairedScores,
    Scored,
    bootstrap_shortfall,
    improvement_interval,
    policy_of,
)
from training.gate.pyfunc_model import Rebuilt, rebuild
from training.gate.registry import (
    CHAMPION,
    ModelLoadError,
    ModelRegistry,
    RegistryError,
    VersionInfo,
)
from training.tasks.base import Task, TaskData
from training.tasks.loader import (
    load_task,
    task_code_sha256,
    task_file_sha256,
)

log = logging.getLogger(__name__)

EVALUATION_FILE = "evaluation.json"
EVALUATION_FORMAT = "retrain-evaluation/2"
EVALUATED_SPLIT = "test"
RUN_METRIC_PREFIX = "test_"
EVALUATE_POLICY = "the gate policy of retrain evaluate"
BOOTSTRAP = "bootstrap"  # evaluation.json's paired bootstrap, present only with a confidence


@dataclass(frozen=True)
class TrainedModel:
    """A training's output rebuilt through its task, with the metadata the training wrote."""

    rebuilt: Rebuilt
    metadata: dict[str, Any]
    model_dir: Path
    task_ref: str  # the reference it was loaded by: --task, else the one model.pt records

    @property
    def model(self) -> nn.Module:
        return self.rebuilt.model

    @property
    def task(self) -> Task:
        return self.rebuilt.task

    @property
    def weights_sha256(self) -> str:
        return str(self.metadata["weights_sha256"])

    @property
    def task_file(self) -> Path | None:
        """The user's task file, for a file task: shipped with the model when it is registered."""
        return parse_task_ref(self.task_ref, Path.cwd()).path


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; expected {what}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error.msg}); expected {what}") from None


def _same_reference(given: str, recorded: str) -> bool:
    """Whether two task references name the same task. A task file may have moved (a pipeline step runs
    in a copy of the code), so files match by name and attribute, and by their code (the modules of their
    folders they import included) when both are here."""
    ours, theirs = parse_task_ref(given, Path.cwd()), parse_task_ref(recorded, Path.cwd())
    if ours.path is None or theirs.path is None:
        return (ours.module, ours.path, ours.attribute) == (theirs.module, theirs.path, theirs.attribute)
    if (ours.path.name, ours.attribute) != (theirs.path.name, theirs.attribute):
        return False
    recorded_sha256 = task_code_sha256(theirs)
    return recorded_sha256 is None or recorded_sha256 == task_code_sha256(ours)


def candidate_task(
    model_dir: Path, task_ref: str | None = None, task_options: Mapping[str, Any] | None = None
):
    """The task a training's model is rebuilt and scored by: `task_ref` with `task_options` when given
    (refused, in one line, unless it is the task and options model.pt records), else the recorded one.
    Returns (task, the reference it was loaded by)."""
    model_file = Path(model_dir) / MODEL_FILE
    payload = read_model_payload(model_file)
    recorded, recorded_options = str(payload["task"]), dict(payload["task_options"])
    if task_ref is None:
        return load_task(recorded, recorded_options), recorded
    given_options = dict(task_options or {})
    if not _same_reference(task_ref, recorded):
        raise InputError(
            f"--task {task_ref!r}: {model_file} was trained with task {recorded!r}; give that task, or "
            "leave --task out to use the one the model records"
        )
    task = load_task(task_ref, given_options)
    # model.pt holds a task secret as `***`: the value given now stands in for it (a rotated token is the
    # same training), and the environment's where none is given.
    given_secrets = secret_options(given_options)
    recorded_options = {
        name: given_secrets.get(name, value) if value == MASK else value
        for name, value in recorded_options.items()
    }
    # Compared as the task sees them, defaults filled in: {} and the defaults written out are the same.
    if dict(task.options()) != dict(load_task(task_ref, recorded_options).options()):
        raise InputError(
            f"--task-options {options_text(given_options)}: {model_file} was trained with task options "
            f"{options_text(recorded_options)}; give those, or leave --task out"
        )
    return task, task_ref


def load_trained_model(
    model_dir: Path, task_ref: str | None = None, task_options: Mapping[str, Any] | None = None
) -> TrainedModel:
    """Rebuild the model a training wrote, refusing weights that do not match their recorded sha256."""
    model_dir = Path(model_dir)
    metadata = read_json(model_dir / METADATA_FILE, "the metadata.json a training writes")
    task, loaded_by = candidate_task(model_dir, task_ref, task_options)
    rebuilt = rebuild(model_dir / MODEL_FILE, task=task)
    if weights_sha256(rebuilt.model) != metadata.get("weights_sha256"):
        raise InputError(f"{model_dir}: model.pt does not match the weights_sha256 in metadata.json")
    return TrainedModel(rebuilt, metadata, model_dir, loaded_by)


def load_matching_data(candidate: TrainedModel, data_dir: Path) -> TaskData:
    """The prepared data version the candidate was trained on, loaded by its task; any other is refused."""
    data = candidate.task.load(Path(data_dir))
    if candidate.metadata.get("data_version") != data.data_version:
        raise InputError(
            f"--data {data_dir}: data version {data.data_version}, but the model was trained on "
            f"{candidate.metadata.get('data_version')}; evaluate on the data version it was trained on"
        )
    return data


def score_version(
    registry: ModelRegistry,
    holder: VersionInfo,
    task: Task,
    split: Any,
    data_version: str,
    resampling: Resampling | None = None,
) -> tuple[Champion, tuple[float, ...] | None]:
    """A registered version scored on `split` by `task` (the candidate's, so both are scored by the same
    code), and with `resampling` its metric on each resample too; unloadable, with the reason, when it
    cannot be loaded or scored."""
    try:
        champion = registry.load_model(holder)
        metrics = scores(task, champion.model, split)
        resampled = resampled_scores(task, champion.model, split, resampling) if resampling else None
    except (ModelLoadError, InputError) as error:
        log.warning("champion %s is unloadable: %s", holder.uri, error)
        return Champion.unloadable(holder.version, str(error)), None
    except Exception as error:  # a champion whose architecture no longer fits the data: not comparable
        reason = f"{holder.uri} cannot be scored on this data: {type(error).__name__}: {str(error)[:200]}"
        log.warning("champion %s is unloadable: %s", holder.uri, reason)
        return Champion.unloadable(holder.version, " ".join(reason.split())), None
    scored = Scored(metrics, data_version, str(holder.weights_sha256))
    return Champion.loaded(holder.version, scored), resampled


def gate_resampling(
    task: Task,
    primary_metric: str | None,
    confidence: float | None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Resampling | None:
    """What to resample for a gate with `confidence` (None without one): the gate's primary metric, as the
    register step resolves it (the task's default unless given), checked against the task's metrics."""
    if confidence is None:
        return None
    policy = policy_of(task, primary_metric=primary_metric, confidence=confidence, where=EVALUATE_POLICY)
    return Resampling(policy.primary_metric, resamples, seed)


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


def task_document(candidate: TrainedModel) -> dict[str, Any]:
    ref = parse_task_ref(candidate.task_ref, Path.cwd())
    return {
        "ref": candidate.task_ref,
        "name": candidate.task.name,
        "options": written_options(candidate.rebuilt.task_options),
        "file_sha256": task_file_sha256(ref),
        "code_sha256": task_code_sha256(ref),
    }


@dataclass(frozen=True)
class GateInputs:
    """The gate's parts the evaluation needs: with `confidence`, what to resample and how often."""

    primary_metric: str | None = None
    confidence: float | None = None
    resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = BOOTSTRAP_SEED

    def __post_init__(self) -> None:
        conflict = resampling_conflict(self.confidence, self.resamples, AS_FLAGS)
        if conflict is not None:
            raise InputError(conflict)


def evaluate(
    model_dir: Path,
    data_dir: Path,
    model_name: str,
    registry: ModelRegistry,
    task_ref: str | None = None,
    task_options: Mapping[str, Any] | None = None,
    gate: GateInputs | None = None,
) -> dict[str, Any]:
    check_model_name(model_name, "--model-name")
    gate = gate or GateInputs()
    candidate = load_trained_model(model_dir, task_ref, task_options)
    resampling = gate_resampling(
        candidate.task, gate.primary_metric, gate.confidence, gate.resamples, gate.seed
    )
    data = load_matching_data(candidate, data_dir)
    split = data.split(EVALUATED_SPLIT)
    metrics = scores(candidate.task, candidate.model, split)
    holder = registry.alias_holder(model_name, CHAMPION)
    champion, champion_resampled = (
        (Champion.none(), None)
        if holder is None
        else score_version(registry, holder, candidate.task, split, data.data_version, resampling)
    )
    evaluation = {
        "format": EVALUATION_FORMAT,
        "model_name": model_name,
        "data_version": data.data_version,
        "split": EVALUATED_SPLIT,
        "rows": len(split),
        "task": task_document(candidate),
        "primary_metric": candidate.task.default_primary_metric,
        "candidate": {
            "weights_sha256": candidate.weights_sha256,
            "mlflow_run_id": candidate.metadata.get("mlflow_run_id"),
            "code_version": candidate.metadata.get("code_version"),
            "metrics": metrics,
        },
        "champion": champion_document(champion),
    }
    if resampling is not None:
        # Paired only with a loaded champion: with none, the first-model floors decide, and no resample
        # is scored (the register step scores them should a champion appear meanwhile).
        paired = None
        if champion_resampled is not None:
            mine = resampled_scores(candidate.task, candidate.model, split, resampling)
            paired = PairedScores(resampling.metric, resampling.seed, mine, champion_resampled, len(split))
            _log_interval(candidate.task, paired, metrics, champion, gate)
        evaluation[BOOTSTRAP] = paired_document(resampling, paired)
    return evaluation


def write_evaluation(
    model_dir: Path,
    data_dir: Path,
    model_name: str,
    registry: ModelRegistry,
    out: Path,
    task_ref: str | None = None,
    task_options: Mapping[str, Any] | None = None,
    gate: GateInputs | None = None,
) -> dict[str, Any]:
    """Evaluate, write evaluation.json, and log the candidate's test metrics and the file to its run."""
    evaluation = evaluate(model_dir, data_dir, model_name, registry, task_ref, task_options, gate)
    path = Path(out) / EVALUATION_FILE
    text = json.dumps(evaluation, indent=2, sort_keys=True) + "\n"
    write_atomically(path, lambda handle: handle.write(text.encode()))
    candidate, champion = evaluation["candidate"], evaluation["champion"]
    _log_to_candidate_run(registry, candidate, path)
    metric = evaluation["primary_metric"]
    log.info(
        "candidate %s on %s %s: %s %s; champion: %s",
        candidate["weights_sha256"][:12],
        evaluation["data_version"],
        EVALUATED_SPLIT,
        metric,
        _number(candidate["metrics"].get(metric)),
        _describe_champion(champion, metric),
    )
    return evaluation


def _log_interval(
    task: Task, paired: PairedScores, metrics: Mapping[str, float], champion: Champion, gate: GateInputs
) -> None:
    """What the register step will see at this confidence, for the evaluation's log (it decides itself):
    the interval, or why there is none to certify with."""
    if champion.scored is None or gate.confidence is None:
        return
    metric = paired.metric
    shortfall = bootstrap_shortfall(paired, gate.confidence)
    if shortfall is not None:
        log.warning(
            "paired bootstrap of %s against champion v%s certifies nothing at confidence %g: %s",
            metric,
            champion.version,
            gate.confidence,
            shortfall,
        )
        return
    mine, theirs = metrics.get(metric, math.nan), champion.scored.metrics.get(metric, math.nan)
    better = task.metrics.higher_is_better(metric)
    improvement = mine - theirs if better else theirs - mine
    interval = improvement_interval(paired, better, gate.confidence, improvement)
    log.info(
        "paired bootstrap of %s against champion v%s: improvement %+.4f, %s %s",
        metric,
        champion.version,
        interval.improvement,
        interval.bound_text,
        interval.basis_text,
    )


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) and math.isfinite(value) else str(value)


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


def _describe_champion(champion: dict[str, Any], metric: str) -> str:
    if champion["state"] == LOADED:
        return f"v{champion['version']} {metric} {_number(champion['metrics'].get(metric))}"
    if champion["version"] is None:
        return "none yet"
    return f"v{champion['version']} {champion['state']} ({champion['error']})"
