"""The demo's story, stage by stage: data lands, the front door decides, the pipeline trains through an
eviction, the gate registers a champion, shifted data raises a drift alert, and a retrain is judged.

Everything is the product's own code wired as a deployment wires it, with local twins at the edges: a
landing folder for the Blob container (`retrain watch --folder`'s events), a loopback topic for Event Grid,
the local runner for Azure ML, SQLite for MLflow. The state lives in `<state>/demo/`, started afresh.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from components.local import RunnerOptions, RunStore
from components.local.submitter import LocalSubmitter
from core.errors import RetrainError
from demo.eviction import EvictOnFirstCheckpoint
from demo.image_chapter import ImageChapter, run_image_chapter
from demo.narration import Narrator
from demo.scenario import DemoSize, demo_environ, write_first_batches, write_shifted_batch
from function_app.ledger.records import SubmissionRecord
from function_app.local.topic import LocalTopic
from function_app.local.watch import FolderSource, Watcher
from function_app.service import EventOutcome, FrontDoor
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

DEMO_FOLDER = "demo"
MODEL_NAME = "digits"


@dataclass
class DemoRecord:
    """What happened, for the summary and for the test that runs the story."""

    home: Path
    deliveries: list[tuple[str, EventOutcome]] = field(default_factory=list)
    submissions: list[SubmissionRecord] = field(default_factory=list)
    registrations: list[dict[str, Any]] = field(default_factory=list)
    train_attempts: list[list[int]] = field(default_factory=list)
    eviction_checkpoint: str | None = None
    drift: dict[str, Any] = field(default_factory=dict)
    image: ImageChapter | None = None


class DemoStory:
    """One run of the story; each stage is a method, and `record` collects what they saw."""

    def __init__(self, home: Path, size: DemoSize, narrator: Narrator) -> None:
        self.size = size
        self.say = narrator
        self.record = DemoRecord(home)
        self.environ = demo_environ(home, size, MODEL_NAME)
        self.settings = AppSettings.from_environ(self.environ)
        self.evictor = EvictOnFirstCheckpoint(home / "checkpoints")
        submitter = LocalSubmitter(
            RunnerOptions(state_root=home),
            self.environ,
            progress=narrator.indented(),
            on_process_started=self.evictor,
        )
        self.front_door: FrontDoor = build_front_door(self.settings, self.environ, submitter=submitter)
        scope = self.settings.blob
        if scope is None or self.settings.landing_folder is None:
            raise RetrainError("the demo's settings name no landing folder; see demo/scenario.py")
        self.watcher = Watcher(
            FolderSource(self.settings.landing_folder, scope), scope, home, self._deliver_blob, _utc_now
        )

    @property
    def home(self) -> Path:
        return self.record.home

    def run(self) -> DemoRecord:
        self.first_data_lands()
        self.first_run()
        self.shifted_data_lands()
        self.drift_check()
        self.retrain_on_drift()
        self.bring_your_own_model()
        return self.record

    # -- the stages -------------------------------------------------------------------------------------

    def first_data_lands(self) -> None:
        self.say.stage("Sample data lands in batches; each file is a Blob-created event")
        write_first_batches(self.settings.landing_folder, self.size)
        events = self.watcher.poll()
        self.say.line(f"Event Grid redelivers {_file_of(events[0])} (at-least-once delivery)")
        self._deliver_blob(events[0])

    def first_run(self) -> None:
        self.say.stage("The debounce window closes: one pipeline run covers the whole batch")
        self.say.line("an eviction notice (SIGTERM) is injected after the train step's first checkpoint")
        self._flush()
        eviction = self.evictor.wait()
        if eviction is None:
            raise RetrainError(f"the demo's eviction did not happen: {self.evictor.error}")
        self.record.eviction_checkpoint = eviction.after_checkpoint

    def shifted_data_lands(self) -> None:
        self.say.stage("A second batch arrives, deliberately shifted (brighter, moved right)")
        # The timer's next tick: it sees the finished run, so the model is no longer in flight.
        self.front_door.flush()
        write_shifted_batch(self.settings.landing_folder, self._arrivals(), self.size)
        self.watcher.poll()

    def drift_check(self) -> None:
        self.say.stage("The drift check compares it with the champion's training data (from lineage)")
        key = secrets.token_urlsafe(32)
        with LocalTopic(key, self._deliver_drift) as topic:
            from demo.drift_step import run_drift_check

            environ = {**self.environ, "RETRAIN_DRIFT_TOPIC_ENDPOINT": topic.endpoint}
            environ["RETRAIN_DRIFT_TOPIC_KEY"] = key
            self.record.drift = run_drift_check(self.home, self._arrivals(), MODEL_NAME, environ, self.say)
        if not self.record.drift.get("alert"):
            raise RetrainError("the shifted batch raised no drift alert; see the drift report above")

    def retrain_on_drift(self) -> None:
        self.say.stage("The alert triggers a retrain on all the data; the gate decides")
        self._flush()

    def bring_your_own_model(self) -> None:
        self.record.image = run_image_chapter(
            self.home, self.say, self.environ, self.size.images_per_class, self.size.image_epochs
        )

    # -- plumbing ---------------------------------------------------------------------------------------

    def _arrivals(self) -> Path:
        return self.home / "arrivals"

    def _deliver_blob(self, event: Mapping[str, Any]) -> None:
        outcome = self.front_door.deliver(event, family="blob")
        self.record.deliveries.append((_file_of(event), outcome))
        self.say.line(f"{_file_of(event):<16} blob   {outcome.decision:<10} {outcome.reason}")

    def _deliver_drift(self, event: Mapping[str, Any]) -> EventOutcome:
        outcome = self.front_door.deliver(event, family="drift")
        self.record.deliveries.append(("drift alert", outcome))
        self.say.line(f"{'drift alert':<16} drift  {outcome.decision:<10} {outcome.reason}")
        return outcome

    def _flush(self) -> None:
        submitted = self.front_door.flush(ignore_quiet=True)
        if len(submitted) != 1:
            raise RetrainError(f"expected one submission from the pending batch, got {len(submitted)}")
        submission = submitted[0]
        self.record.submissions.append(submission)
        run = RunStore(self.home / "runs").load(submission.details["run_id"])
        self.record.train_attempts.append([attempt.exit_code for attempt in run.step("train").attempts])
        registration = _registration(run.outputs.get("registration"))
        self.record.registrations.append(registration)
        self.say.line(f"submission {submission.id}: {submission.status}, job {submission.job_name}")
        if submission.estimate:
            self.say.line(f"estimated: {submission.estimate['summary']}")
        decision = registration.get("decision", {})
        accepted = decision.get("accepted")
        verdict = f"registered as v{registration.get('registered_version')}" if accepted else "refused"
        self.say.line(f"gate: {verdict}; " + "; ".join(decision.get("reasons", [])))


def _registration(folder: str | None) -> dict[str, Any]:
    if folder is None:
        raise RetrainError("the pipeline run has no registration output; see its run record")
    return json.loads((Path(folder) / "registration.json").read_text())


def _file_of(event: Mapping[str, Any]) -> str:
    return str(event["data"]["url"]).rsplit("/", 1)[-1]


def _utc_now() -> datetime:
    return datetime.now(UTC)


def fresh_home(state_root: Path) -> Path:
    home = state_root / DEMO_FOLDER
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    return home


def run_story(state_root: Path, out: TextIO, size: DemoSize, clock: Callable[[], float]) -> DemoStory:
    narrator = Narrator(out, clock)
    home = fresh_home(state_root)
    narrator.title(f"Retrain demo: new data or drift in, a trustworthy model out (state in {home})")
    story = DemoStory(home, size, narrator)
    story.run()
    return story
