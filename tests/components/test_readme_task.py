"""The README's "Bring your own model" section, as a user copies it: its minimal task file and its
configuration run through two `retrain run`s. The first model becomes champion, and the gate reads the
direction of the task's own metric (mse, lower is better): a candidate with a lower mse is promoted.
(That a worse one is refused by the same direction is tests/training/gate/test_user_task_gate.py's.) Then
the section's Python serving lines run as written, from the folder whose `.retrain/` is the runs' state: the
store they name is the one the local runs registered into.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.components.run_harness import QUICK, retrain_run

from components.model_config import MODELS_DIR_VARIABLE
from components.specs import REPO_ROOT


def readme_block(name: str) -> str:
    """The code block the README marks `<!-- readme-task: NAME -->`, as a user would copy it."""
    text = (REPO_ROOT / "README.md").read_text()
    marker = f"<!-- readme-task: {name} -->\n"
    assert text.count(marker) == 1, f"the README has no single block marked {name}"
    block = text.split(marker, 1)[1]
    assert block.startswith("```")
    return block.split("\n", 1)[1].split("\n```\n", 1)[0] + "\n"


def test_the_readme_s_minimal_task_runs_to_a_champion_and_is_gated_by_mse(tmp_path):
    import pandas as pd

    models = tmp_path / "models"
    models.mkdir()
    for name in ("houses_task.py", "houses.toml"):
        (models / name).write_text(readme_block(name))
    state = tmp_path / ".retrain"  # the default state folder of a user working in tmp_path
    generator = np.random.default_rng(7)

    def batches(count: int) -> Path:  # each batch adds 300 new rows of price = w·x + 3 + noise
        raw = tmp_path / f"raw-{count}"
        raw.mkdir()
        for number in range(1, count + 1):
            x = np.random.default_rng(number).normal(size=(300, 3))
            price = x @ [2.0, -1.0, 0.5] + 3.0 + generator.normal(0.0, 0.1, size=300)
            frame = pd.DataFrame(x, columns=["x1", "x2", "x3"]).assign(price=price, listing=f"b{number}")
            frame.to_csv(raw / f"batch-{number:04d}.csv", index=False)
        return raw

    record, first, output = retrain_run(
        state, models, "--model-name", "houses", "--data", str(batches(2)), *QUICK
    )
    assert (first["decision"]["accepted"], first["registered_version"]) == (True, "1")
    assert first["decision"]["primary_metric"] == "mse"
    commands = {step.name: step.command for step in record.steps}
    train = commands["train"]
    assert train[train.index("--task") + 1] == f"{models / 'houses_task.py'}:HousePrices"

    # The cost estimate of a model never trained here assumes the setting's hours, and says so.
    assert output.splitlines()[0].endswith(
        "; train time assumed: RETRAIN_EXPECTED_TRAIN_HOURS=1 h (no measured training)"
    )
    trained = json.loads((Path(record.step("train").outputs["model"]) / "metadata.json").read_text())

    run, better, output = retrain_run(
        state, models, "--model-name", "houses", "--data", str(batches(3)), "--epochs", "60", *QUICK
    )
    # The next one uses what the first took: its seconds per step and steps per epoch, at 60 epochs.
    per_step, per_epoch = (
        trained["wall_time_seconds"] / trained["steps"],
        trained["steps"] / trained["epochs"],
    )
    assert output.splitlines()[0].endswith(
        f"; train time measured on run {record.run_id}: {per_step:.3g} s per step x {per_epoch:g} steps per "
        "epoch x 60 epochs, on 1 process(es) there"
    )
    decision = better["decision"]
    assert (decision["accepted"], better["registered_version"]) == (True, "2")
    assert decision["candidate_value"] < decision["champion_value"]
    # The promotion says why, and sets the candidate's metrics beside the champion's, mse first.
    lines = output.splitlines()
    said = lines.index(f"run {run.run_id}: Completed, registered as v2: {decision['reasons'][0]}")
    mine, theirs = better["metrics"], better["champion_compared"]["metrics"]
    assert [line.split() for line in lines[said + 1 : said + 4]] == [
        ["metric", "candidate", "champion", "v1"],
        ["mse", f"{mine['mse']:.4f}", f"{theirs['mse']:.4f}", "(primary)"],
        ["mae", f"{mine['mae']:.4f}", f"{theirs['mae']:.4f}"],
    ]

    # The README's serving lines find the champion the runs registered: prices close to the file's.
    raw = batches(1)
    prices = pd.read_csv(raw / "batch-0001.csv")["price"].to_numpy()
    served = np.array(_served_by_the_readme_lines(tmp_path, raw))
    assert served.shape == prices.shape
    assert float(np.mean((served - prices) ** 2)) < 10 * mine["mse"]


@pytest.fixture(autouse=True)
def _no_stray_configuration(monkeypatch):
    """Each run here names its configuration folder; the working folder's must not matter."""
    monkeypatch.delenv(MODELS_DIR_VARIABLE, raising=False)


def _served_by_the_readme_lines(folder: Path, raw: Path) -> list[float]:
    """The README's Python serving lines, run in `folder` with RAW standing for `raw` and no MLflow or
    RETRAIN_HOME variable set: what they print, read back as numbers."""
    (folder / "RAW").symlink_to(raw)
    environ = {
        name: value for name, value in os.environ.items() if not name.startswith(("MLFLOW_", "RETRAIN_"))
    }
    served = subprocess.run(
        [sys.executable, "-c", readme_block("serve_houses.py")],
        cwd=folder,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert served.returncode == 0, served.stderr[-3000:]
    return [float(value) for value in served.stdout.replace("[", " ").replace("]", " ").split()]
