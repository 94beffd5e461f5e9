"""The module-scoped test harness of the registry tests: one MLflow store, models from the real trainer,
and the evaluate and register steps run through the command line as the pipeline runs them."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

from mlflow.tracking import MlflowClient

from helpers.training.small_run import SMALL_RUN
from training.cli import main
from training.engine.outputs import scores
from training.gate.evaluate import EVALUATION_FILE, load_trained_model
from training.gate.register import REGISTRATION_FILE
from training.gate.registry import CHAMPION, MlflowStore, ModelRegistry

FAST = ["--checkpoint-every-steps", "off", "--progress", "none"]
MODELS = {
    "weak": ["--epochs", "1", "--task-option", "hidden_width=16"],
    "mid": ["--epochs", "2"],
    "strong": ["--epochs", "3"],
    "best": ["--epochs", "5", "--task-option", "hidden_width=128"],
}
# Trained like a model of MODELS with another seed: as good as it, up to chance (the gate's confidence
# tests). Kept out of MODELS, whose models build_harness checks to rank with clear gaps.
RESEEDED = {"strong-reseeded": [*MODELS["strong"], "--seed", "8"]}
RECIPES = {**MODELS, **RESEEDED}
RAW_VERSION = "rd-0123456789abcdef"


class Harness:
    """The module's store and models, and the evaluate/register steps run as the pipeline runs them."""

    def __init__(self, root: Path, data: Path, trained: Path | None = None) -> None:
        self.root = root
        self.data = data
        self._trained = trained  # untracked models trained once per session, copied rather than retrained
        self.tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
        self.registry = ModelRegistry(MlflowStore(self.tracking_uri, (root / "mlartifacts").as_uri()))
        self.client = MlflowClient(self.tracking_uri)
        self.models: dict[str, Path] = {}
        self._outputs = 0

    def train(self, name: str, tracked: bool) -> None:
        out = self.root / "models" / name
        if not tracked and self._trained is not None:
            self.models[name] = Path(shutil.copytree(train_untracked(self._trained, self.data, name), out))
            return
        artifacts = (self.root / "mlartifacts").as_uri()  # not MLflow's default, ./mlruns in the cwd
        tracking = ["--mlflow-tracking-uri", self.tracking_uri, "--mlflow-artifact-location", artifacts]
        tracking = tracking if tracked else ["--no-mlflow"]
        checkpoints = self.root / "ck" / name
        locations = ["--data", str(self.data), "--out", str(out), "--checkpoints", str(checkpoints)]
        assert main(["train", *locations, *SMALL_RUN, *RECIPES[name], *FAST, *tracking]) == 0
        self.models[name] = out

    def folder(self, kind: str) -> Path:
        self._outputs += 1
        return self.root / "outputs" / f"{kind}-{self._outputs}"

    def evaluate(self, model: str, model_name: str, *extra: str) -> Path:
        out = self.folder("evaluation")
        argv = ["evaluate", "--model", str(self.models[model]), "--data", str(self.data), "--out", str(out)]
        store = ["--model-name", model_name, "--mlflow-tracking-uri", self.tracking_uri]
        assert main([*argv, *store, *extra]) == 0
        return out

    def register_argv(
        self, model: str, evaluation: Path, model_name: str, out: Path, *extra: str, data: Path | None = None
    ) -> list[str]:
        data = data or self.data
        return [
            "register",
            *("--model", str(self.models[model]), "--evaluation", str(evaluation), "--data", str(data)),
            *("--model-name", model_name, "--trigger", f"event_id=evt-{model},kind=blob"),
            *("--raw-data-version", RAW_VERSION, "--environment-version", "7", "--out", str(out)),
            *("--mlflow-tracking-uri", self.tracking_uri, "--lock", str(self.root / "locks")),
            *extra,
        ]

    def register(
        self, model: str, evaluation: Path, model_name: str, *extra: str, data: Path | None = None
    ) -> dict:
        out = self.folder("registration")
        assert main(self.register_argv(model, evaluation, model_name, out, *extra, data=data)) == 0
        return json.loads((out / REGISTRATION_FILE).read_text())

    def evaluate_and_register(self, model: str, model_name: str, *extra: str) -> dict:
        return self.register(model, self.evaluate(model, model_name), model_name, *extra)

    def weights(self, model: str) -> str:
        return load_trained_model(self.models[model]).weights_sha256

    def champion_weights(self, model_name: str) -> str | None:
        holder = self.registry.alias_holder(model_name, CHAMPION)
        return holder.weights_sha256 if holder else None


def train_untracked(trained: Path, data: Path, name: str) -> Path:
    """The session's untracked model `name`, trained on first use (training is deterministic per seed)."""
    out = trained / name
    if not (out / "metadata.json").exists():
        locations = ["--data", str(data), "--out", str(out), "--checkpoints", str(trained / "ck" / name)]
        assert main(["train", *locations, *SMALL_RUN, *RECIPES[name], *FAST, "--no-mlflow"]) == 0
    return out


def build_harness(
    root: Path, data: Path, models: tuple[str, ...], tracked: str | None = None, trained: Path | None = None
) -> Harness:
    """Train `models` (the one named `tracked` with MLflow tracking) and check they rank as named."""
    harness = Harness(root, data, trained)
    for name in models:
        harness.train(name, tracked=name == tracked)
    f1 = {}
    for name, path in harness.models.items():
        trained = load_trained_model(path)
        f1[name] = scores(trained.task, trained.model, trained.task.load(data).split("test"))["macro_f1"]
    # The scenarios rely on this ranking, with clear gaps; a change in the trainer shows up here first.
    ranked = [name for name in MODELS if name in f1]
    assert all(f1[better] - f1[worse] > 0.01 for worse, better in itertools.pairwise(ranked)), f1
    assert f1.get("weak", 0.0) < 0.8 < 0.9 < f1.get("mid", 1.0), f1
    return harness


def evaluation_document(folder: Path) -> dict:
    return json.loads((folder / EVALUATION_FILE).read_text())
