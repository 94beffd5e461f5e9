"""`retrain drift --task image`, run as the drift step runs it (a separate process, MLflow on SQLite), against
a version prepared by `retrain prepare --task image`: a batch drawn like the training data stays quiet, a
shifted one (brighter, shapes moved right and down) raises the alert. Drift is information, not failure: both
exit 0, and the last line of output, drift.json and the check's MLflow run say which."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.training.image_harness import isolated_environ, prepared_image_folder, run_retrain
from helpers.training.warm_training import WarmStarts
from mlflow.tracking import MlflowClient

from training.drift.check import DriftPolicy
from training.tasks.image.features import FEATURE_NAMES
from training.tasks.image.manifest import read_manifest, read_split
from training.tasks.image.sample_data import write_sample_images

SIZE = 16
SIDE = 24  # the PNGs are larger than the trained size: prepare and the check both resize them
PER_CLASS_CURRENT = 40  # 4 classes: 160 images a batch
MOVED = {"brightness", "mean_red", "mean_green", "mean_blue", "centre_x", "centre_y"}


@dataclass(frozen=True)
class Folders:
    root: Path
    prepared: Path
    alike: Path
    shifted: Path
    environ: dict[str, str]

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, warm_starts: WarmStarts) -> Folders:
    root = tmp_path_factory.mktemp("image-drift")
    environ = isolated_environ(root / "home")
    _, prepared = prepared_image_folder(
        warm_starts, root, per_class=60, seed=0, side=SIDE, size=SIZE, environ=environ
    )
    write_sample_images(root / "alike", per_class=PER_CLASS_CURRENT, seed=1, side=SIDE)
    write_sample_images(root / "shifted", per_class=PER_CLASS_CURRENT, seed=2, side=SIDE, shift=1.0)
    return Folders(root, prepared, root / "alike", root / "shifted", environ)


def check(starts: WarmStarts, folders: Folders, current: Path, out: Path) -> tuple[int, str, dict]:
    """`retrain drift` of `current` against the prepared version: exit code, last line, drift.json."""
    result = run_retrain(
        starts, "drift", "--model-name", "shapes", "--task", "image", "--task-option", f"size={SIZE}",
        "--reference", str(folders.prepared), "--current", str(current), "--out", str(out),
        "--mlflow-tracking-uri", folders.tracking_uri, environ=folders.environ,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "could not log the drift check" not in result.stderr, result.stderr[-3000:]
    last_line = result.stdout.strip().splitlines()[-1]
    return result.returncode, last_line, json.loads((out / "drift.json").read_text())


def test_a_shifted_batch_alerts_and_one_drawn_like_the_training_data_stays_quiet(folders, warm_starts):
    quiet_out, alert_out = folders.root / "quiet", folders.root / "alert"
    _, quiet_line, quiet = check(warm_starts, folders, folders.alike, quiet_out)
    _, alert_line, alert = check(warm_starts, folders, folders.shifted, alert_out)

    # The last line: the verdict, the evidence and where the report is; an alert says it was not published.
    assert quiet_line.startswith("drift shapes: no alert: 0 of 7 features drifted (alert at 1); max PSI ")
    assert quiet_line.endswith(f"; report in {quiet_out / 'drift.json'}")
    assert alert_line.startswith("drift shapes: ALERT: drift detected: ")
    assert alert_line.endswith(
        f"; report in {alert_out / 'drift.json'}; not published (RETRAIN_DRIFT_TOPIC_ENDPOINT is not set)"
    )

    # drift.json: the image task's features, compared with the prepared version's train split.
    manifest = read_manifest(folders.prepared)
    train_rows = len(read_split(folders.prepared, manifest, "train").keys)
    for document, current in ((quiet, folders.alike), (alert, folders.shifted)):
        assert [feature["name"] for feature in document["features"]] == list(FEATURE_NAMES)
        assert document["task"] == {
            "name": "image",
            "options": {"size": [SIZE, SIZE], "width": 32, "dropout": 0.1, "augment": True},
            "from": "--task",
        }
        assert document["policy"] == DriftPolicy().describe()
        assert document["reference"]["source"] == "folder"
        assert document["reference"]["data_version"] == manifest.data_version
        assert document["reference"]["rows"] == train_rows
        assert document["current"]["folder"] == str(current)
        assert document["current"]["rows"] == 4 * PER_CLASS_CURRENT == len(document["current"]["files"])
        assert document["current"]["data_version"] is None  # a plain folder, not a pinned snapshot
    assert not quiet["alert"] and quiet["drifted_features"] == [] and quiet["drifted_count"] == 0
    assert alert["alert"] and set(alert["drifted_features"]) >= MOVED
    assert alert["drifted_count"] == len(alert["drifted_features"])
    # A feature drifts when its move is both material (PSI) and significant (KS): the alert's moved features
    # are both; the quiet batch's PSI may pass the threshold by chance on a small batch, but not its KS test.
    policy = DriftPolicy()
    scores = {feature["name"]: feature for feature in alert["features"]}
    assert all(scores[name]["psi"] > policy.psi_threshold for name in MOVED)
    assert all(scores[name]["ks_pvalue"] < policy.ks_pvalue for name in MOVED)
    assert all(feature["ks_pvalue"] >= policy.ks_pvalue for feature in quiet["features"])
    for out in (quiet_out, alert_out):
        assert (out / "drift_psi.png").read_bytes().startswith(b"\x89PNG")

    # Each check is an MLflow run in the SQLite store, tagged with its verdict, with its report attached.
    client = MlflowClient(folders.tracking_uri)
    experiment = client.get_experiment_by_name("retrain-drift")
    runs = {
        run.data.tags["retrain.drift.check_id"]: run for run in client.search_runs([experiment.experiment_id])
    }
    assert set(runs) == {quiet["check_id"], alert["check_id"]}
    for document in (quiet, alert):
        run = runs[document["check_id"]]
        assert run.info.status == "FINISHED"
        assert run.data.tags["retrain.drift.model_name"] == "shapes"
        assert run.data.tags["retrain.drift.alert"] == str(document["alert"]).lower()
        assert run.data.tags["retrain.drift.reference_data_version"] == manifest.data_version
        assert run.data.metrics["drifted_features"] == document["drifted_count"]
        assert run.data.metrics["max_psi"] == pytest.approx(document["max_psi"])
        assert {artifact.path for artifact in client.list_artifacts(run.info.run_id)} == {
            "drift.json",
            "drift_psi.png",
        }
