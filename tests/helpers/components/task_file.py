"""A user's task file for the tests that only load one (preflight, task checks, code snapshots)."""

from __future__ import annotations

from pathlib import Path

# A complete task, as far as the preflight looks: it loads, and declares its metrics. Its parts are never
# called by the tests that use it (no step of theirs trains).
TASK_FILE = """
from training.tasks.base import Metric, MetricSet


class Flowers:
    name = "flowers"
    raw_suffixes = (".csv", ".tsv")
    metrics = MetricSet((
        Metric("accuracy", "higher"), Metric("macro_f1", "higher"), Metric("loss", "lower"),
        Metric("recall_*", "higher"),
    ))
    default_primary_metric = "macro_f1"

    def __init__(self, width: int = 8, note: str = "") -> None:
        self.width, self.note = width, note

    def options(self):
        return {"width": self.width, "note": self.note}

    def prepare(self, raw, out, *, previous, split): raise NotImplementedError
    def load(self, data_dir): raise NotImplementedError
    def build_model(self, info): raise NotImplementedError
    def loss(self, model, batch): raise NotImplementedError
    def score(self, model, split): raise NotImplementedError
    def input_example(self, data): raise NotImplementedError
    def predict(self, model, info, inputs): raise NotImplementedError
    def drift_features(self, source, *, prepared): raise NotImplementedError
"""


def write_task_file(folder: Path, name: str = "flowers_task.py", text: str = TASK_FILE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path
