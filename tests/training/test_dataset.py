from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from core.errors import InputError
from training.tasks.tabular.dataset import load_prepared
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.sample_data import write_sample_batches
from training.tasks.tabular.schema import SPLIT_NAMES


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("dataset")
    write_sample_batches(base / "raw", batches=3)
    prepare(base / "raw", base / "prepared")
    return base / "prepared"


@pytest.fixture
def prepared_copy(prepared_dir, tmp_path) -> Path:
    return Path(shutil.copytree(prepared_dir, tmp_path / "prepared"))


def test_splits_are_tensors_of_the_digits_in_key_order(prepared_dir):
    data = load_prepared(prepared_dir)
    digits = load_digits()

    for name in SPLIT_NAMES:
        split = data.split(name)
        assert split.features.dtype == torch.float32
        assert split.labels.dtype == torch.int64
        assert split.features.shape == (len(split), 64)
        assert split.labels.shape == (len(split),)
        assert split.keys == sorted(split.keys)
        rows = [int(key.removeprefix("digits-")) for key in split.keys]
        assert np.array_equal(split.features.numpy(), digits.data[rows].astype(np.float32))
        assert np.array_equal(split.labels.numpy(), digits.target[rows])


def test_splits_are_disjoint_and_cover_every_row(prepared_dir):
    data = load_prepared(prepared_dir)

    keys = [key for name in SPLIT_NAMES for key in data.split(name).keys]
    assert len(keys) == len(set(keys)) == 1797
    assert data.data_version == data.manifest.data_version
    assert data.schema.n_classes == 10


def test_normalization_is_the_train_statistics_with_std_1_for_constant_features(prepared_dir):
    data = load_prepared(prepared_dir)

    mean, std = data.normalization
    train = data.split("train").features.double()
    assert mean.dtype == std.dtype == torch.float32
    assert torch.allclose(mean.double(), train.mean(dim=0))
    train_std = train.std(dim=0, unbiased=False)
    varying = train_std > 0
    assert torch.allclose(std.double()[varying], train_std[varying])
    assert std[0] == 1.0  # pixel_0 is blank in every digit
    assert torch.isfinite((data.split("test").features - mean) / std).all()


def test_unknown_split_name_is_an_input_error(prepared_dir):
    with pytest.raises(
        InputError, match=r"no split named 'holdout'; expected one of train, validation, test"
    ):
        load_prepared(prepared_dir).split("holdout")


def test_a_changed_split_file_is_refused(prepared_copy):
    path = prepared_copy / "validation.parquet"
    path.write_bytes(path.read_bytes() + b"\0")

    with pytest.raises(
        InputError, match=r"validation.parquet: sha256 differs from the manifest.*re-run `retrain prepare`"
    ):
        load_prepared(prepared_copy)


def test_a_missing_split_file_is_refused(prepared_copy):
    (prepared_copy / "test.parquet").unlink()

    with pytest.raises(
        InputError, match=r"test.parquet: cannot read the test split.*re-run `retrain prepare`"
    ):
        load_prepared(prepared_copy)


def test_a_folder_without_manifest_is_refused(prepared_copy):
    (prepared_copy / "manifest.json").unlink()

    with pytest.raises(InputError, match=r"no manifest.json, so it is not a prepared data version; re-run"):
        load_prepared(prepared_copy)


def test_a_manifest_with_a_wrong_file_hash_is_refused(prepared_copy):
    path = prepared_copy / "manifest.json"
    document = json.loads(path.read_text())
    document["splits"]["train"]["file_sha256"] = "0" * 64
    path.write_text(json.dumps(document))

    with pytest.raises(InputError, match=r"train.parquet: sha256 differs from the manifest"):
        load_prepared(prepared_copy)
