from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from core.errors import InputError
from training.data.splits import SPLIT_NAMES
from training.tasks.tabular.dataset import load_prepared
from training.tasks.tabular.manifest import read_manifest, read_split_table
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.sample_data import write_sample_batches


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("dataset")
    write_sample_batches(base / "raw", batches=3)
    prepare(base / "raw", base / "prepared")
    return base / "prepared"


@pytest.fixture
def prepared_copy(prepared_dir, tmp_path) -> Path:
    return Path(shutil.copytree(prepared_dir, tmp_path / "prepared"))


def rows_of(data, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    split = data.split(name)
    return split.rows[torch.arange(len(split))]


def test_splits_are_the_digits_in_key_order_as_float32_features_and_int64_labels(prepared_dir):
    data = load_prepared(prepared_dir)
    digits = load_digits()

    for name in SPLIT_NAMES:
        features, labels = rows_of(data, name)
        assert features.dtype == torch.float32 and labels.dtype == torch.int64
        assert features.shape == (len(data.split(name)), 64) and labels.shape == (len(data.split(name)),)
        keys = read_split_table(prepared_dir, data.manifest, name).column("row_key").to_pylist()
        assert keys == sorted(keys)
        rows = [int(key.removeprefix("digits-")) for key in keys]
        assert np.array_equal(features.numpy(), digits.data[rows].astype(np.float32))
        assert np.array_equal(labels.numpy(), digits.target[rows])


def test_a_batch_is_the_rows_asked_for_in_the_order_asked(prepared_dir):
    data = load_prepared(prepared_dir)
    features, labels = rows_of(data, "train")
    order = torch.tensor([5, 0, len(labels) - 1, 5])

    batch_features, batch_labels = data.split("train").rows[order]

    assert torch.equal(batch_features, features[order]) and torch.equal(batch_labels, labels[order])


def test_splits_are_disjoint_and_cover_every_row(prepared_dir):
    data = load_prepared(prepared_dir)

    keys = [
        key
        for name in SPLIT_NAMES
        for key in read_split_table(prepared_dir, data.manifest, name).column("row_key").to_pylist()
    ]
    assert len(keys) == len(set(keys)) == 1797
    assert data.data_version == data.manifest.data_version
    assert data.schema.n_classes == 10


def test_normalization_is_the_train_statistics_with_std_1_for_constant_features(prepared_dir):
    data = load_prepared(prepared_dir)

    mean, std = data.normalization
    train = rows_of(data, "train")[0].double()
    assert mean.dtype == std.dtype == torch.float32
    assert torch.allclose(mean.double(), train.mean(dim=0))
    train_std = train.std(dim=0, unbiased=False)
    varying = train_std > 0
    assert torch.allclose(std.double()[varying], train_std[varying])
    assert std[0] == 1.0  # pixel_0 is blank in every digit
    assert torch.isfinite((rows_of(data, "test")[0] - mean) / std).all()


def test_unknown_split_name_is_an_input_error(prepared_dir):
    with pytest.raises(
        InputError, match=r"no split named 'holdout'; expected one of train, validation, test"
    ):
        load_prepared(prepared_dir).split("holdout")


def test_a_changed_shard_is_refused(prepared_copy):
    name = read_manifest(prepared_copy).parts[-1].splits[1].shard.inputs  # a validation shard
    path = prepared_copy / name
    path.write_bytes(path.read_bytes()[:-4] + b"\0\0\0\1")  # one feature of the last row, same size

    with pytest.raises(
        InputError, match=rf"{re.escape(name)}: sha256 differs from the manifest.*re-run `retrain prepare`"
    ):
        load_prepared(prepared_copy)


def test_a_missing_shard_is_refused(prepared_copy):
    name = read_manifest(prepared_copy).parts[0].splits[2].shard.targets  # a test shard
    (prepared_copy / name).unlink()

    with pytest.raises(
        InputError, match=rf"{re.escape(name)}: cannot read the shard.*re-run `retrain prepare`"
    ):
        load_prepared(prepared_copy)


def test_a_changed_deletion_vector_is_refused(prepared_copy):
    entry = next(entry for part in read_manifest(prepared_copy).parts for entry in part.splits if entry.dead)
    (prepared_copy / entry.dead).write_bytes(b"\x93NUMPY")

    with pytest.raises(
        InputError, match=rf"{re.escape(entry.dead)}: sha256 differs from the manifest.*re-run"
    ):
        load_prepared(prepared_copy)


def test_a_folder_without_manifest_is_refused(prepared_copy):
    (prepared_copy / "manifest.json").unlink()

    with pytest.raises(InputError, match=r"no manifest.json, so it is not a prepared data version; re-run"):
        load_prepared(prepared_copy)


def test_a_manifest_with_a_wrong_file_hash_is_refused(prepared_copy):
    path = prepared_copy / "manifest.json"
    document = json.loads(path.read_text())
    shard = document["parts"][0]["splits"]["train"]["shard"]
    shard["targets_sha256"] = "0" * 64
    path.write_text(json.dumps(document))

    with pytest.raises(InputError, match=r"content gives dv-[0-9a-f]{16}; the manifest was edited"):
        load_prepared(prepared_copy)
