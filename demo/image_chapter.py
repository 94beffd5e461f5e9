"""The demo's last chapter, bring your own model: an image classifier through the very same engine.

Labelled PNGs land in class folders; `retrain run --model-name shapes` reads the model's configuration
(models/shapes.toml: the built-in image task, its gate and pipeline parameters) and runs prepare → train →
evaluate → register on the local runner, exactly as for the digits. The champion then serves what a caller
has, a uint8 N×H×W×3 array, through `mlflow.pyfunc.load_model("models:/shapes@champion")`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.local import RunStore
from components.local import cli as local_cli
from components.specs import REPO_ROOT
from core.errors import RetrainError
from demo.narration import Narrator

IMAGE_MODEL = "shapes"
CONFIG_FILE = REPO_ROOT / "models" / f"{IMAGE_MODEL}.toml"


@dataclass
class ImageChapter:
    """What the chapter saw: the run's registration, and the champion's answers on new images."""

    registration: dict[str, Any] = field(default_factory=dict)
    answers: list[tuple[str, str]] = field(default_factory=list)  # (true class, predicted class)

    @property
    def right(self) -> int:
        return sum(truth == answer for truth, answer in self.answers)


def run_image_chapter(
    home: Path, say: Narrator, environ: Mapping[str, str], per_class: int, epochs: int
) -> ImageChapter:
    from training.tasks.image.sample_data import write_sample_images

    say.stage(f"Bring your own model: an image classifier through the same engine ({_shown(CONFIG_FILE)})")
    raw = home / "shapes-raw"
    images = write_sample_images(raw, per_class=per_class, seed=0)
    classes = sorted({path.parent.name for path in images})
    say.line(
        f"{len(images)} labelled PNGs land in class folders: {', '.join(name + '/' for name in classes)}"
    )
    chapter = ImageChapter(registration=_retrain_run(home, say, environ, raw, epochs))
    decision = chapter.registration.get("decision", {})
    verdict = f"registered as v{chapter.registration.get('registered_version')}"
    say.line(f"gate: {verdict if decision.get('accepted') else 'refused'}; " + "; ".join(decision["reasons"]))
    if not decision.get("accepted"):
        raise RetrainError("the image model was not registered; see the gate's reasons above")
    chapter.answers = _serve_new_images(home, raw.parent / "shapes-new", per_class=2)
    say.line(
        "mlflow.pyfunc.load_model('models:/shapes@champion').predict(uint8 N×32×32×3): "
        f"{chapter.right} of {len(chapter.answers)} new images right"
    )
    for truth, answer in chapter.answers[:: max(1, len(chapter.answers) // 4)]:
        say.line(f"  a new {truth:<8} -> {answer}")
    return chapter


def _retrain_run(
    home: Path, say: Narrator, environ: Mapping[str, str], raw: Path, epochs: int
) -> dict[str, Any]:
    """`retrain run --config models/shapes.toml --data RAW --epochs N`, as a user types it."""
    args = argparse.Namespace(
        data=raw,
        model_name=IMAGE_MODEL,
        config=CONFIG_FILE,
        task=None,
        task_options=None,
        task_option=[],
        epochs=epochs,
        param=[("checkpoint_every_seconds", "off")],
        nproc=1,
        force_rerun=False,
        environ=dict(environ),
        state_root=home,
    )
    say.line(f"retrain run --model-name {IMAGE_MODEL} --data {raw.name} --epochs {epochs}")
    if local_cli.run_command(args, say.indented()) != 0:
        raise RetrainError("the image model's pipeline run did not complete; see its steps above")
    run = RunStore(home / "runs").list(limit=1)[0]
    return json.loads((Path(run.outputs["registration"]) / "registration.json").read_text())


def _serve_new_images(home: Path, folder: Path, per_class: int) -> list[tuple[str, str]]:
    """The champion, loaded as any MLflow client loads it, on images it has never seen."""
    import numpy as np
    from PIL import Image

    from training.gate.registry import ModelRegistry, resolve_store
    from training.tasks.image.sample_data import write_sample_images

    new = write_sample_images(folder, per_class=per_class, seed=1)
    model = ModelRegistry(resolve_store(None, {}, home)).load_served(IMAGE_MODEL)
    pixels = np.stack([np.asarray(Image.open(path).convert("RGB")) for path in new])
    answers = [str(answer) for answer in model.predict(pixels)]
    return [(path.parent.name, answer) for path, answer in zip(new, answers, strict=True)]


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
