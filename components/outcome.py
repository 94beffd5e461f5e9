"""What became of a run, in words: the gate's decision beside the run's status.

A run's status says only whether its steps ran. Whether it changed anything is the register step's call,
which it writes to `registration.json` in the pipeline's `registration` output: a new model version, or a
refusal and the gate's reasons. `gate_details` reads that into a submission's details (`registered_version`,
`decision`, `reasons`), next to what a failed run leaves there (`failed_step`, `log_tail`, `error`);
`describe_outcome` turns such details into the one line that `retrain run`, `retrain flush` and
`retrain trigger` print, a promotion with its reasons as a refusal has them. `rejected_details` reads the
raw files the prepare step left out (its `rejected_inputs` output, core/rejected_inputs.py), which the front
door records and pins into no later data version. `describe_outcome`'s lines:

    Completed, registered as v3: macro_f1 0.9612 beats champion v2's 0.9544 by at least 0.002 on dv-...
    Completed, refused: accuracy 0.4100 is below the floor 0.8; ...
    Failed at prep: batch-0005.csv: missing column 'label'; expected the columns ...

`score_lines` sets the candidate's metrics beside the champion's it was judged against, as `retrain run`
prints them under that line, the primary metric first:

    metric     candidate  champion v2
    macro_f1      0.9612       0.9544  (primary)
    accuracy      0.9650       0.9583
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from components.request import COMPLETED, FAILED
from core.rejected_inputs import REPORT_FILE, read_report
from core.secrets import mask_secrets

log = logging.getLogger(__name__)

# The register step's output (components/pipeline.yml) and the file in it (training/gate/register.py).
REGISTRATION_OUTPUT = "registration"
REGISTRATION_FILE = "registration.json"
REGISTERED, REFUSED = "registered", "refused"
# A submission's details key for the raw files its prepare step left out (rejected_details).
REJECTED_KEY = "rejected_inputs"
# A submission's details key for where its prepare step's data version lies (a local folder, an Azure ML
# URI), which the model's next run builds on (RunRequest.previous_prepared).
PREPARED_KEY = "prepared_data"
# What every step's command line prints before exiting non-zero (training/cli.py, training/engine/worker.py):
# in a log tail it is the line that says why, wherever torchrun's own report puts it.
_STEP_ERROR = "retrain: error: "


def read_registration(outputs: Mapping[str, str]) -> dict[str, Any] | None:
    """The register step's record from a completed run's pipeline outputs; None when the run has none (a
    pipeline without a register step) or it cannot be read. Reading it never fails the run it describes."""
    folder = outputs.get(REGISTRATION_OUTPUT)
    if folder is None:
        return None
    path = Path(folder) / REGISTRATION_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        log.warning("the gate's decision is not known: %s is unreadable (%s)", path, error)
        return None
    return record if isinstance(record, dict) else None


def gate_details(outputs: Mapping[str, str]) -> dict[str, Any]:
    """The gate's decision from a completed run's pipeline outputs; empty when it is not known."""
    return decision_details(read_registration(outputs))


def rejected_details(folders: Iterable[str]) -> dict[str, Any]:
    """The raw files the prepare step left out (core/rejected_inputs.py), from its `rejected_inputs`
    output folder(s), as a submission's details: `{REJECTED_KEY: [{"name", "reason"}, ...]}`; empty when
    no report is known (no prepare step ran, or one from before reports). A report that cannot be read is
    said in one warning and left out: it never fails the run it describes."""
    found: dict[str, dict[str, str]] = {}
    known = False
    for folder in folders:
        try:
            files = read_report(Path(folder))
        except ValueError as error:
            log.warning("the raw files prep left out are not known: %s/%s %s", folder, REPORT_FILE, error)
            continue
        if files is not None:
            known = True
            found.update((file.name, file.to_dict()) for file in files)
    return {REJECTED_KEY: [found[name] for name in sorted(found)]} if known else {}


def decision_details(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """A registration record's decision as a submission's details; empty when there is none or it lacks
    one."""
    if record is None:
        return {}
    try:
        accepted = record["decision"]["accepted"]
        reasons = [str(reason) for reason in record["decision"]["reasons"]]
        version = record["registered_version"]
    except (KeyError, TypeError) as error:
        log.warning("the gate's decision is not known: its record lacks %s", error)
        return {}
    return {
        "registered_version": None if version is None else str(version),
        "decision": REGISTERED if accepted else REFUSED,
        "reasons": reasons,
    }


def describe_outcome(status: str, details: Mapping[str, Any]) -> str:
    """`status`, with what happened beside it when the details know: the version the gate registered, its
    reasons for refusing, or the step that failed and why."""
    if status == COMPLETED:
        if details.get("decision") == REFUSED:
            return f"{status}, refused: {'; '.join(details.get('reasons') or ()) or 'no reason given'}"
        if details.get("registered_version"):
            reasons = "; ".join(details.get("reasons") or ())
            return f"{status}, registered as v{details['registered_version']}" + (
                f": {reasons}" if reasons else ""
            )
    if status == FAILED and details.get("failed_step"):
        why = _failure(details)  # a step's log may quote a URL with its SAS token: masked, as errors are
        return f"{status} at {details['failed_step']}" + (f": {mask_secrets(why)}" if why else "")
    return status


def _failure(details: Mapping[str, Any]) -> str | None:
    """The line that says why a step failed: its own error line, else the runner's headline, else the last
    line of its log."""
    tail: Sequence[str] = details.get("log_tail") or ()
    for line in reversed(tail):
        if _STEP_ERROR in line:
            return line.split(_STEP_ERROR, 1)[1].strip()
    if details.get("error"):
        return str(details["error"])
    return next((line.strip() for line in reversed(tail) if line.strip()), None)


def score_lines(record: Mapping[str, Any] | None) -> list[str]:
    """The candidate's metrics beside the champion's, from a registration record: a header, then one line
    per metric, the primary one first, the rest in the task's order. Empty when the record has none."""
    if record is None or not isinstance(record.get("metrics"), Mapping) or not record["metrics"]:
        return []
    candidate = record["metrics"]
    compared = record.get("champion_compared")
    compared = compared if isinstance(compared, Mapping) else {}
    champion = compared.get("metrics") if isinstance(compared.get("metrics"), Mapping) else {}
    decision = record.get("decision")
    primary = decision.get("primary_metric") if isinstance(decision, Mapping) else None
    version = compared.get("version")
    if champion:
        heading = f"champion v{version}"
    elif version is not None:
        heading = f"champion v{version} (unloadable)"
    else:
        heading = "no champion"
    names = [*dict.fromkeys([*candidate, *champion])]
    names.sort(key=lambda name: name != primary)  # stable: the task's order after the primary metric
    rows = [("metric", "candidate", heading, "")]
    rows += [
        (
            name,
            _score(candidate.get(name)),
            _score(champion.get(name)),
            "(primary)" if name == primary else "",
        )
        for name in names
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    return [
        f"{name:<{widths[0]}}  {mine:>{widths[1]}}  {theirs:>{widths[2]}}  {note}".rstrip()
        for name, mine, theirs, note in rows
    ]


def _score(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:.4f}"


def training_line(model_folder: str | Path | None) -> str | None:
    """How the train step ended, from its model's metadata.json: the stop reason, which weights are the
    candidate, and any checkpoint that was not saved; None without a readable one (a reused or failed
    step says so elsewhere)."""
    try:
        metadata = json.loads((Path(str(model_folder)) / "metadata.json").read_text(encoding="utf-8"))
        steps, stopped = int(metadata["steps"]), int(metadata.get("stopped_at_step", metadata["steps"]))
        reason, candidate = str(metadata["stop_reason"]), str(metadata["candidate"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    validation = metadata.get("validation") or {}
    if reason == "early_stopping":
        ended = (
            f"stopped early at step {stopped}: {validation.get('metric', 'the metric')} did not improve in "
            f"{validation.get('patience', '?')} validations"
        )
    else:
        ended = f"ran all {steps} steps"
    if candidate == "best":
        chosen = f"the best step's weights, step {metadata.get('candidate_step')}"
        if validation.get("best_value") is not None:
            chosen += f" ({validation.get('metric')} {float(validation['best_value']):.4g})"
    else:
        chosen = f"the last step's weights, step {metadata.get('candidate_step', steps)}"
    text = f"train: {ended}; candidate: {chosen}"
    not_saved = (metadata.get("checkpoints") or {}).get("not_saved") or []
    if not_saved:
        text += f"; {len(not_saved)} checkpoint(s) not saved (see the train step's log)"
    evictions = int(metadata.get("evictions_survived") or 0)
    if evictions:
        text += f"; survived {evictions} eviction(s)"
    return text
