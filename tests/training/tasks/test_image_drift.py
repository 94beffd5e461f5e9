"""The image task's drift features: per-image statistics that the drift check compares, which move for a
shifted batch (brighter, moved) and stay put for a batch drawn like the training data."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from core.errors import InputError
from training.data.splits import SplitFractions
from training.drift.check import DriftPolicy, compare
from training.tasks.base import FeatureTable
from training.tasks.image.features import FEATURE_NAMES, image_features
from training.tasks.image.manifest import read_manifest, read_split
from training.tasks.image.sample_data import write_sample_images
from training.tasks.image.task import ImageTask

SIZE = 16


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drift")
    write_sample_images(root / "raw", per_class=60, seed=0, side=24)
    ImageTask(size=SIZE).prepare(root / "raw", root / "prepared", previous=None, split=SplitFractions())
    write_sample_images(root / "alike", per_class=40, seed=1, side=24)
    write_sample_images(root / "shifted", per_class=40, seed=2, side=24, shift=1.0)
    return {name: root / name for name in ("raw", "prepared", "alike", "shifted")}


def features(task: ImageTask, source: Path, prepared: bool = False) -> FeatureTable:
    table = task.drift_features(source, prepared=prepared)
    assert isinstance(table, FeatureTable) and table.names == FEATURE_NAMES
    return table


def test_the_feature_names_are_stable():
    assert FEATURE_NAMES == (
        "brightness", "contrast", "mean_red", "mean_green", "mean_blue", "centre_x", "centre_y"
    )  # fmt: skip


def test_a_shifted_batch_raises_an_alert_and_one_drawn_like_the_training_data_does_not(batches):
    task = ImageTask(size=SIZE)
    reference = features(task, batches["prepared"], prepared=True)
    alike = features(task, batches["alike"])
    shifted = features(task, batches["shifted"])

    quiet = compare(reference.values, alike.values, reference.names, DriftPolicy())
    alert = compare(reference.values, shifted.values, reference.names, DriftPolicy())

    assert not quiet.alert, quiet.summary()
    assert quiet.drifted == ()
    assert alert.alert, alert.summary()
    assert {"brightness", "mean_red", "mean_green", "mean_blue", "centre_x", "centre_y"} <= set(alert.drifted)


def test_raw_images_are_decoded_for_drift_exactly_as_prepare_decodes_them(batches):
    task = ImageTask(size=SIZE)
    prepared = batches["prepared"]
    train = read_split(prepared, read_manifest(prepared), "train")
    raw_rows = features(task, batches["raw"])
    keys = sorted(f"{path.parent.name}/{path.name}" for path in batches["raw"].glob("*/*.png"))

    rows = [keys.index(key) for key in train.keys]
    assert np.array_equal(raw_rows.values[rows], features(task, prepared, prepared=True).values)
    assert np.array_equal(raw_rows.values[rows], image_features(train.pixels))


def test_features_measure_what_their_names_say():
    dark_left = np.zeros((1, 10, 10, 3), dtype=np.uint8)
    dark_left[0, 2:4, 0:2] = (255, 0, 0)  # a red spot in the upper left corner
    black = np.zeros((1, 10, 10, 3), dtype=np.uint8)
    grey = np.full((1, 10, 10, 3), 51, dtype=np.uint8)

    spot, dark, flat = (
        dict(zip(FEATURE_NAMES, image_features(x)[0], strict=True)) for x in (dark_left, black, grey)
    )

    assert spot["mean_red"] == pytest.approx(4 / 100) and spot["mean_green"] == 0.0
    assert spot["centre_x"] == pytest.approx(0.5 / 9) and spot["centre_y"] == pytest.approx(2.5 / 9)
    assert dark["centre_x"] == dark["centre_y"] == 0.5 and dark["brightness"] == 0.0
    assert flat["brightness"] == pytest.approx(0.2) and flat["contrast"] == pytest.approx(0.0, abs=1e-12)


def test_unlabelled_images_count_for_drift_but_a_folder_without_images_is_refused(batches, tmp_path):
    task = ImageTask(size=SIZE)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    for path in sorted(batches["alike"].glob("circle/*.png"))[:5]:
        shutil.copyfile(path, incoming / path.name)

    empty = tmp_path / "empty"
    empty.mkdir()

    assert len(features(task, incoming)) == 5
    with pytest.raises(InputError, match=r"holds no \.png/\.jpg/\.jpeg images"):
        task.drift_features(empty, prepared=False)
