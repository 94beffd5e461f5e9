"""A user's task file whose gate policy names a metric the task does not report is refused by the flush
before anything is recorded or spent: no submission, no run counted in the day's budget, no training. Its
claims stay pending and say why. The check (the real preflight, a `python -m training.cli check-model`
process) runs once per version of the file, whichever front door flushes. A class's metric that only the
data can refuse (the built-in tabular task on digits: `recall_99` of 10 classes) is refused by the local
run's pre-run check once the data is pinned: the flush holds the batch the same way and gives back the
run it had counted."""

from __future__ import annotations

import os
from pathlib import Path

from helpers.function_app import corpus
from helpers.function_app.front_door_settings import app_settings

from components.preflight import RecordedPreflight, SubprocessPreflight
from components.request import COMPLETED
from components.run_settings import RunSettings
from function_app.ledger.ledger import PENDING
from function_app.local.watch import FolderSource, Watcher
from function_app.pinning import content_etag
from function_app.service import utc_now
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door
from training.tasks.tabular.sample_data import write_sample_batches

# A complete task as far as the preflight looks; each import of the file (one per check process) adds a
# line to the counter file next to it.
TASK_FILE = """
import os
from pathlib import Path

from training.tasks.base import Metric, MetricSet

with open(Path(__file__).with_name("imports"), "a") as counter:
    counter.write("imported\\n")


class Flowers:
    name = "flowers"
    raw_suffixes = (".csv",)
    metrics = MetricSet((Metric("accuracy", "higher"), Metric("loss", "lower")))
    default_primary_metric = "accuracy"

    def options(self): return {}
    def prepare(self, raw, out, *, previous, split): raise NotImplementedError
    def load(self, data_dir): raise NotImplementedError
    def build_model(self, info): raise NotImplementedError
    def loss(self, model, batch): raise NotImplementedError
    def score(self, model, split): raise NotImplementedError
    def input_example(self, data): raise NotImplementedError
    def predict(self, model, info, inputs): raise NotImplementedError
    def drift_features(self, source, *, prepared): raise NotImplementedError
"""


def _checks(task_file: Path) -> int:
    counter = task_file.with_name("imports")
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def _served(tmp_path: Path, gate: str) -> tuple[dict[str, str], Path]:
    """Local-submitter settings serving `flowers`, a user's task file with this [gate], and the file."""
    task_file = tmp_path / "tasks" / "flowers_task.py"
    task_file.parent.mkdir(parents=True)
    task_file.write_text(TASK_FILE)
    models = tmp_path / "models"
    models.mkdir()
    (models / "flowers.toml").write_text(
        f'[task]\nref = "{task_file}:Flowers"\n\n[gate]\n{gate}\n\n'
        '[trigger]\nprefix = "flowers"\nsuffixes = [".csv"]\n'
    )
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "batch-0001.csv").write_text("x,label\n1,a\n")
    home = tmp_path / "home"
    environ = app_settings(
        home,
        RETRAIN_SUBMITTER="local",
        RETRAIN_MODELS="flowers",
        RETRAIN_MODELS_DIR=str(models),
        RETRAIN_LANDING_FOLDER=str(landing),
    )
    for single in ("RETRAIN_MODEL_NAME", "RETRAIN_BLOB_PREFIX"):
        environ.pop(single)
    return environ, task_file


def _front_door(environ: dict[str, str]):
    """A front door as a fresh process starts one (nothing remembered in memory)."""
    return build_front_door(AppSettings.from_environ(environ), environ)


def test_a_task_file_whose_policy_names_a_metric_it_lacks_is_held_by_the_flush_at_no_cost(tmp_path):
    environ, task_file = _served(tmp_path, 'primary_metric = "f1"')
    front = _front_door(environ)
    landed = Path(environ["RETRAIN_LANDING_FOLDER"]) / "batch-0001.csv"
    event = corpus.blob_created(
        name="flowers/batch-0001.csv", eTag=content_etag(landed), envelope={"id": "e-1"}
    )
    front.deliver(event)

    assert front.flush(ignore_quiet=True) == []

    reason = front.verdicts()["flowers"].reason
    assert reason.startswith("held: preflight: ") and "\n" not in reason
    assert "primary_metric names metric 'f1', which the task does not report" in reason
    assert "expected one of accuracy (higher is better), loss (lower is better)" in reason
    snapshot = front.ledger_snapshot()
    assert snapshot["submissions"] == []  # nothing recorded
    state, _ = front.ledger.load_state("flowers")
    assert (state.runs_today, state.in_flight_id, state.last_submission_at) == (0, None, None)  # no budget
    (claim,) = front.ledger.claims("flowers", PENDING)  # still pending, saying why
    assert claim.record.reason == reason and claim.record.submission is None
    assert not (Path(environ["RETRAIN_HOME"]) / "runs").exists()  # nothing ran
    assert _checks(task_file) == 1

    # Another flush, from another process: the kept verdict answers; no check runs, nothing is rewritten.
    again = _front_door(environ)
    assert again.flush(ignore_quiet=True) == []
    assert again.verdicts()["flowers"].reason == reason
    assert _checks(task_file) == 1
    (unchanged,) = again.ledger.claims("flowers", PENDING)
    assert unchanged.version == claim.version
    assert again.ledger_snapshot()["submissions"] == []

    # A new version of the file is checked anew (still refused: its policy is the same), and so is a new
    # version of a module it imports from its folder, the file unchanged: the module is the task's code.
    task_file.with_name("flowers_metrics.py").write_text("NAMES = ('accuracy', 'loss')\n")
    task_file.write_text(TASK_FILE + "\nimport flowers_metrics\n")
    assert _front_door(environ).flush(ignore_quiet=True) == []
    assert _checks(task_file) == 2
    task_file.with_name("flowers_metrics.py").write_text("NAMES = ('accuracy', 'loss', 'f1')\n")
    assert _front_door(environ).flush(ignore_quiet=True) == []
    assert _checks(task_file) == 3
    assert "primary_metric names metric 'f1'" in front.verdicts()["flowers"].reason
    state, _ = front.ledger.load_state("flowers")
    assert state.runs_today == 0


def test_a_passed_check_is_kept_for_the_version_it_checked(tmp_path):
    _, task_file = _served(tmp_path, "")
    run = RunSettings(model_name="flowers", task=f"{task_file}:Flowers", parameters={"floors": "loss=2"})
    folder = tmp_path / "verdicts"

    first = RecordedPreflight(SubprocessPreflight(), folder).check(run)
    kept = RecordedPreflight(SubprocessPreflight(), folder).check(run)  # another process's preflight

    assert kept == first and first.primary_metric == "accuracy"
    assert _checks(task_file) == 1


def test_a_module_tasks_verdict_is_kept_per_version_of_its_sources(tmp_path):
    environ, task_file = _served(tmp_path, 'primary_metric = "f1"')
    package = tmp_path / "mods" / "flowers_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text(TASK_FILE)
    config = Path(environ["RETRAIN_MODELS_DIR"]) / "flowers.toml"
    config.write_text(config.read_text().replace(f"{task_file}:Flowers", "flowers_pkg.task:Flowers"))
    environ["PYTHONPATH"] = str(tmp_path / "mods")
    landed = Path(environ["RETRAIN_LANDING_FOLDER"]) / "batch-0001.csv"
    front = _front_door(environ)
    front.deliver(corpus.blob_created(name="flowers/batch-0001.csv", eTag=content_etag(landed)))

    assert front.flush(ignore_quiet=True) == []
    assert "primary_metric names metric 'f1'" in front.verdicts()["flowers"].reason
    assert _front_door(environ).flush(ignore_quiet=True) == []  # another process: the kept verdict
    assert _checks(package / "task.py") == 1

    (package / "__init__.py").write_text("# edited\n")  # any source of the package is the task's code
    assert _front_door(environ).flush(ignore_quiet=True) == []
    assert _checks(package / "task.py") == 2
    assert front.ledger_snapshot()["submissions"] == []


# A user's classifier whose options name its classes: its per-class recalls are one per class.
PER_CLASS = TASK_FILE.replace(
    'metrics = MetricSet((Metric("accuracy", "higher"), Metric("loss", "lower")))',
    'metrics = MetricSet((Metric("accuracy", "higher"), Metric("recall_*", "higher", per_class=True)))',
).replace(
    "    def options(self): return {}",
    '    def __init__(self, classes=("a", "b", "c")): self.classes = list(classes)\n'
    '    def options(self): return {"classes": self.classes}\n'
    "    def class_count(self, raw): return len(self.classes)",
)


def test_a_class_s_metric_or_stopping_metric_the_user_s_task_cannot_report_is_held_at_no_cost(tmp_path):
    environ, task_file = _served(tmp_path, "floors = { recall_3 = 0.5 }")
    task_file.write_text(PER_CLASS)
    landed = Path(environ["RETRAIN_LANDING_FOLDER"]) / "batch-0001.csv"
    front = _front_door(environ)
    front.deliver(corpus.blob_created(name="flowers/batch-0001.csv", eTag=content_etag(landed)))

    assert front.flush(ignore_quiet=True) == []
    reason = front.verdicts()["flowers"].reason
    assert "floors names metric 'recall_3', which the task does not report" in reason
    assert "recall_0 to recall_2 for its 3 classes" in reason and "\n" not in reason

    # The early-stopping metric, which the trainer would refuse at its first validation, is checked too.
    config = Path(environ["RETRAIN_MODELS_DIR"]) / "flowers.toml"
    config.write_text(
        config.read_text().replace("recall_3 = 0.5", "recall_2 = 0.5")
        + '\n[pipeline]\nvalidate_every_epochs = 1\nearly_stopping_metric = "validation_recall_7"\n'
    )
    again = _front_door(environ)
    assert again.flush(ignore_quiet=True) == []
    assert again.verdicts()["flowers"].reason == (
        "held: preflight: parameter early_stopping_metric is 'validation_recall_7': task 'flowers' does not "
        "report it; expected one of validation_accuracy, validation_recall_*"
    )
    state, _ = again.ledger.load_state("flowers")
    assert (state.runs_today, state.in_flight_id) == (0, None)  # no budget spent
    assert again.ledger_snapshot()["submissions"] == []
    assert not (Path(environ["RETRAIN_HOME"]) / "runs").exists()  # nothing ran


# The built-in tabular task on digits: no option fixes its class count, the data does (labels 0-9).
DIGITS_MODEL_FILE = """\
[task]
ref = "tabular"

[task.options]
hidden_width = 16

[gate]
primary_metric = "accuracy"
min_improvement = 0.0
floors = {}
first_model_floors = {}
max_regression = {}

[pipeline]
epochs = 1
global_batch_size = 64
checkpoint_every_seconds = "off"

[trigger]
prefix = "digits"
"""


def test_a_class_the_data_lacks_holds_the_batch_at_its_pre_run_check_and_spends_no_budget(tmp_path):
    landing, home, models = tmp_path / "landing", tmp_path / "home", tmp_path / "models"
    write_sample_batches(landing, batches=1)
    models.mkdir()
    (models / "digits.toml").write_text(DIGITS_MODEL_FILE)
    settings = app_settings(
        home,
        RETRAIN_SUBMITTER="local",
        RETRAIN_MODELS="digits",
        RETRAIN_MODELS_DIR=str(models),
        RETRAIN_LANDING_FOLDER=str(landing),
    )
    for single in ("RETRAIN_MODEL_NAME", "RETRAIN_BLOB_PREFIX"):  # the file's [trigger] says them
        settings.pop(single)
    # The steps' environment, as `retrain flush` gives them its own; the setting wins over the file's [gate].
    environ = {**os.environ, **settings, "RETRAIN_PIPELINE_PARAMETERS": "primary_metric=recall_99"}
    front = _front_door(environ)  # start-up cannot know the class count: only the data fixes it
    scope = front.settings.models[0].scope
    Watcher(FolderSource(landing, scope), scope, home, lambda e: front.deliver(e, "blob"), utc_now).poll()

    for door in (front, _front_door(environ)):  # two flushes, the second from a fresh process
        assert door.flush(ignore_quiet=True) == []
        reason = door.verdicts()["digits"].reason
        assert reason.startswith("held: preflight: ") and "\n" not in reason
        assert "primary_metric names metric 'recall_99'" in reason
        assert "recall_0 to recall_9 for its 10 classes" in reason
        state, _ = door.ledger.load_state("digits")
        assert (state.runs_today, state.in_flight_id, state.last_submission_at) == (0, None, None)
        (claim,) = door.ledger.claims("digits", PENDING)  # still pending, saying why
        assert claim.record.reason == reason and claim.record.submission is None
        assert not (home / "runs").exists() or not any((home / "runs").iterdir())  # no step ran

    # The setting fixed, the next flush trains the held batch.
    environ.pop("RETRAIN_PIPELINE_PARAMETERS")
    [trained] = _front_door(environ).flush(ignore_quiet=True)
    assert trained.status == COMPLETED, trained.details
    assert trained.details["decision"] == "registered"
    state, _ = front.ledger.load_state("digits")
    assert state.runs_today == 1 and front.ledger.claims("digits", PENDING) == []
