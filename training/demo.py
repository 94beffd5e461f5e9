"""`retrain demo`: the training story on one machine, with no Azure account.

Sample data lands as raw batches, is prepared into a data version, and trains on two data-parallel
processes (torchrun, gloo). Part-way through, the demo delivers an eviction notice (SIGTERM), exactly as
a low-priority node receives one: the ranks agree on a step, save, and exit as preempted. The same
command is then started again and resumes from that checkpoint to the end.

Everything lands in `<state>/demo/` (`.retrain/demo/` by default), which each run starts afresh.
"""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from training.errors import RetrainError
from training.local_state import default_mlflow_tracking_uri
from training.preemption import PREEMPTED_EXIT_CODE
from training.prepare import prepare
from training.progress import BarRenderer, describe
from training.sample_data import write_sample_batches
from training.schema import Manifest
from training.supervise import Event, TrainingProcess

DEMO_TRAINING = [
    "--epochs", "8", "--global-batch-size", "32", "--hidden-width", "512", "--seed", "0",
    "--checkpoint-every-steps", "50", "--mlflow-experiment", "retrain-demo",
]  # fmt: skip
NPROC = 2
EVICT_AT_FRACTION = 0.4


@dataclass(frozen=True)
class DemoLayout:
    root: Path

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def prepared(self) -> Path:
        return self.root / "prepared"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model(self) -> Path:
        return self.root / "model"

    def log(self, attempt: int) -> Path:
        return self.root / f"train-attempt-{attempt}.log"


class _Narrator:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def step(self, number: int, text: str) -> None:
        self.say(f"\n[{number}/4] {text}")


def run_demo(state_root: Path, out: TextIO, environ: Mapping[str, str]) -> int:
    layout = DemoLayout(state_root / "demo")
    shutil.rmtree(layout.root, ignore_errors=True)
    layout.root.mkdir(parents=True)
    narrator = _Narrator(out)
    narrator.say(f"Retrain demo: new data -> prepare -> train on {NPROC} processes, evicted and resumed")
    narrator.say(f"everything lands in {layout.root}")
    manifest = _land_and_prepare(layout, narrator)
    narrator.step(3, f"Train on {NPROC} processes (torchrun, gloo), checkpointing every 50 steps")
    _train_until_evicted(layout, narrator, environ)
    _train_to_the_end(layout, narrator, environ)
    tracking_uri = environ.get("MLFLOW_TRACKING_URI") or default_mlflow_tracking_uri(state_root)
    _summarise(layout, manifest, narrator, tracking_uri)
    return 0


def _land_and_prepare(layout: DemoLayout, narrator: _Narrator) -> Manifest:
    narrator.step(1, "New data lands")
    batches = write_sample_batches(layout.landing, batches=4)
    narrator.say(f"      {len(batches)} raw batches of the digits data set in {layout.landing}")
    narrator.step(2, "Prepare: validate, drop duplicates, split by a stable hash of each row key")
    manifest = prepare(layout.landing, layout.prepared)
    rows = ", ".join(f"{entry.name} {entry.rows}" for entry in manifest.splits)
    narrator.say(f"      data version {manifest.data_version}: {rows}")
    stats = manifest.stats
    narrator.say(f"      {stats.raw_rows} raw rows, {stats.exact_duplicates} re-delivered duplicates dropped")
    return manifest


def _start(layout: DemoLayout, attempt: int, environ: Mapping[str, str]) -> TrainingProcess:
    arguments = [
        "--nproc", str(NPROC), "--data", str(layout.prepared), "--out", str(layout.model),
        "--checkpoints", str(layout.checkpoints), *DEMO_TRAINING,
    ]  # fmt: skip
    return TrainingProcess(arguments, env=environ, stderr=layout.log(attempt).open("w"))


def _show(bar: BarRenderer, event: Event) -> None:
    if event["event"] in ("step", "checkpoint", "resumed"):
        bar.emit(event)


def _train_until_evicted(layout: DemoLayout, narrator: _Narrator, environ: Mapping[str, str]) -> None:
    process = _start(layout, 1, environ)
    bar = BarRenderer(narrator.out, indent="      ")
    evict_at: int | None = None
    for event in process.events():
        _show(bar, event)
        if event["event"] == "start":
            evict_at = max(30, int(event["total_steps"] * EVICT_AT_FRACTION))
        if event["event"] == "step" and evict_at is not None and event["step"] >= evict_at:
            bar.close()
            narrator.say(f"      EVICTION NOTICE (SIGTERM) delivered at step {event['step']}")
            process.send_signal(signal.SIGTERM)
            break
    code = process.finish(on_event=lambda event: _show(bar, event))
    bar.close()
    preempted = [event for event in process.events_seen if event["event"] == "preempted"]
    if code != PREEMPTED_EXIT_CODE or not preempted:
        raise RetrainError(f"the evicted training exited with code {code}; see {layout.log(1)}")
    narrator.say(f"      {describe(preempted[0])}")


def _train_to_the_end(layout: DemoLayout, narrator: _Narrator, environ: Mapping[str, str]) -> None:
    narrator.say("      restarting the same command, as the cluster would after the eviction:")
    process = _start(layout, 2, environ)
    bar = BarRenderer(narrator.out, indent="      ")
    code = process.finish(on_event=lambda event: _show(bar, event))
    bar.close()
    if code != 0:
        raise RetrainError(f"the resumed training exited with code {code}; see {layout.log(2)}")


def _summarise(layout: DemoLayout, manifest: Manifest, narrator: _Narrator, tracking_uri: str) -> None:
    metadata = json.loads((layout.model / "metadata.json").read_text())
    metrics = metadata["final_metrics"]
    narrator.step(4, "A trained model, and where everything is")
    narrator.say(
        f"      validation accuracy {metrics['validation_accuracy']:.4f} after {metadata['steps']} steps; "
        f"resumes {metadata['resumes']}, evictions survived {metadata['evictions_survived']}"
    )
    narrator.say(f"      weights sha256 {metadata['weights_sha256']}")
    narrator.say(f"      model        {layout.model / 'model.pt'}")
    narrator.say(f"      metadata     {layout.model / 'metadata.json'}")
    narrator.say(f"      checkpoints  {layout.checkpoints}")
    narrator.say(f"      data         {layout.prepared} ({manifest.data_version})")
    if metadata["mlflow_run_id"]:
        narrator.say(f"      MLflow run   {metadata['mlflow_run_id']} in experiment retrain-demo")
        narrator.say(f"                   mlflow ui --backend-store-uri {tracking_uri}")
    narrator.say(f"      worker logs  {layout.log(1)}, {layout.log(2)}")
