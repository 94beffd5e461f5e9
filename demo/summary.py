"""The demo's closing summary: events -> decisions -> runs -> model versions with their lineage, the cost
estimates the front door recorded, and where the plots and the state are."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from demo.image_chapter import IMAGE_MODEL
from demo.narration import Narrator
from demo.story import MODEL_NAME, DemoRecord

PLOTS_FOLDER = "plots"


def _table(say: Narrator, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        say.line("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _event_label(event: Mapping[str, Any]) -> str:
    details = event.get("details") or {}
    if event["kind"] == "blob":
        # The dedupe key is the blob's URL and eTag: the file name says which batch it was.
        key = str(details.get("url") or event.get("dedupe_key") or "?")
        return key.rsplit("/", 1)[-1].split("#", 1)[0]
    return f"{event['kind']} event {str(event.get('event_id') or '?')[:8]}"


def events_table(say: Narrator, ledger: Mapping[str, Any]) -> None:
    say.line("Events -> decisions (the ledger, oldest first):")
    rows = [
        (_event_label(event), event["kind"], event["decision"], event.get("submission") or "-")
        for event in sorted(ledger["events"], key=lambda event: event["received_at"])
    ]
    _table(say, ("event", "kind", "decision", "submission"), rows)


def runs_table(say: Narrator, record: DemoRecord) -> None:
    say.line("Submissions -> pipeline runs -> model versions:")
    rows = []
    for submission, attempts, registration in zip(
        record.submissions, record.train_attempts, record.registrations, strict=True
    ):
        decision = registration.get("decision", {})
        outcome = (
            f"v{registration['registered_version']}" if decision.get("accepted") else "refused by the gate"
        )
        rows.append(
            (
                submission.id,
                submission.kind,
                submission.raw_version or "-",
                str(submission.details.get("run_id", "-")),
                "train exit codes " + ",".join(str(code) for code in attempts),
                outcome,
            )
        )
    _table(say, ("submission", "kind", "data", "local run", "attempts", "model"), rows)


def lineage_lines(say: Narrator, listing: Mapping[str, Any]) -> None:
    say.line(f"Model versions of {MODEL_NAME!r}, newest first, with lineage:")
    for version in listing["versions"]:
        lineage, metrics = version["lineage"], version["metrics"]
        aliases = ", ".join(version["aliases"]) or "no alias"
        trigger = lineage.get("trigger") or {}
        say.line(
            f"  v{version['version']} ({aliases}): {trigger.get('kind')} event {trigger.get('event_id')}"
            f" -> raw data {lineage.get('raw_version', '?')}"
            f" -> prepared {lineage.get('data_version', '?')}"
            f" -> job {lineage.get('pipeline_job', '?')}"
            f" -> macro-F1 {float(metrics.get('macro_f1', float('nan'))):.4f}"
        )


def image_lines(say: Narrator, record: DemoRecord) -> None:
    """The chapter's own model: another task through the same engine, gate and registry."""
    chapter = record.image
    if chapter is None:
        return
    registration = chapter.registration
    lineage = registration.get("lineage", {})
    metrics = registration.get("metrics", {})
    say.line(
        f"Model {IMAGE_MODEL!r} (task {registration.get('task', {}).get('ref', 'image')}): "
        f"v{registration.get('registered_version')} -> prepared {lineage.get('data_version', '?')}"
        f" -> macro-F1 {float(metrics.get('macro_f1', float('nan'))):.4f}"
        f"; served {chapter.right} of {len(chapter.answers)} new images right"
    )


def cost_lines(say: Narrator, record: DemoRecord) -> None:
    say.line("The planner's spot estimate, recorded in the ledger before each submission:")
    for submission in record.submissions:
        estimate = submission.estimate or {}
        say.line(f"  {submission.id}: {estimate.get('summary', 'no estimate recorded')}")


def where_lines(say: Narrator, record: DemoRecord, plots: Sequence[Path]) -> None:
    home = record.home
    say.line("Where everything is:")
    for plot in plots:
        say.line(f"  plot         {plot}")
    say.line(f"  drift report {Path(record.drift['out']) / 'drift.json'}")
    say.line(f"  ledger       {home / 'ledger'}        (retrain ledger, with RETRAIN_HOME={home})")
    say.line(f"  runs         {home / 'runs'}          (retrain runs)")
    say.line(f"  registry     {home / 'mlflow.db'}    (retrain models --model-name NAME; mlflow ui ...)")


def summarise(
    say: Narrator, record: DemoRecord, ledger: Mapping[str, Any], listing: Mapping[str, Any]
) -> None:
    plots = [*plot_training_runs(record), Path(record.drift["out"]) / "drift_psi.png"]
    say.stage("Summary")
    events_table(say, ledger)
    say.line("")
    runs_table(say, record)
    say.line("")
    lineage_lines(say, listing)
    image_lines(say, record)
    say.line("")
    cost_lines(say, record)
    say.line("")
    where_lines(say, record, plots)


def plot_training_runs(record: DemoRecord) -> list[Path]:
    """A loss-curve PNG per pipeline run, from its training run's MLflow history."""
    from mlflow.tracking import MlflowClient

    from components.local import RunStore
    from training.engine.run_plots import plot_training_curves
    from training.local_state import default_mlflow_tracking_uri

    client = MlflowClient(default_mlflow_tracking_uri(record.home))
    plots = []
    for submission in record.submissions:
        run = RunStore(record.home / "runs").load(submission.details["run_id"])
        metadata = json.loads((Path(run.step("train").outputs["model"]) / "metadata.json").read_text())
        run_id = metadata.get("mlflow_run_id")
        if not run_id:
            continue
        history = {
            name: [(metric.step, metric.value) for metric in client.get_metric_history(run_id, name)]
            for name in ("loss", "validation_accuracy")
        }
        path = record.home / PLOTS_FOLDER / f"loss-{submission.id}.png"
        title = f"{submission.id}: {submission.kind} run on {submission.raw_version}"
        plots.append(plot_training_curves(history["loss"], history["validation_accuracy"], path, title))
    return plots
