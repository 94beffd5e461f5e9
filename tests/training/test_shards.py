"""Array shards: a split written in bounded files and read back memory-mapped, by the engine's indices, with
what a process holds of it bounded by a budget rather than by the data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import InputError
from training.data.shards import open_split, split_shards


def written(folder: Path, inputs: np.ndarray, targets: np.ndarray, shard_bytes: int):
    files, shards = split_shards("train", inputs, targets, shard_bytes)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return shards


def rss_file_kb() -> int:
    """The file-backed pages this process holds (/proc/self/status RssFile): mapped shards count there."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


def test_a_batch_is_exactly_the_rows_asked_for_across_shards(tmp_path: Path):
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((1000, 3, 4)).astype(np.float32)
    targets = rng.integers(0, 10, 1000)
    shards = written(tmp_path, inputs, targets, shard_bytes=48 * 100)  # 100 rows a shard
    split = open_split(tmp_path, shards)
    order = torch.tensor([999, 0, 150, 150, 499, -1])

    batch_inputs, batch_targets = split[order]

    assert len(shards) == 10 and len(split) == 1000
    assert np.array_equal(batch_inputs.numpy(), inputs[order.numpy()])
    assert np.array_equal(batch_targets.numpy(), targets[order.numpy()])
    one_input, one_target = split[7]
    assert torch.equal(one_input, torch.from_numpy(inputs[7])) and int(one_target) == targets[7]
    with pytest.raises(IndexError, match="out of range"):
        split[torch.tensor([1000])]


def test_reading_every_row_holds_the_budget_of_the_data_not_all_of_it(tmp_path: Path):
    rows, width = 131_072, 256  # 128 MiB of float32 inputs
    inputs = np.lib.stride_tricks.as_strided(np.arange(width, dtype=np.float32), (rows, width), (0, 4))
    shards = written(tmp_path, inputs, np.zeros(rows, dtype=np.int64), shard_bytes=32 << 20)
    order = torch.from_numpy(np.random.default_rng(1).permutation(rows))

    def mapped_in(budget: int) -> int:
        split = open_split(tmp_path, shards, resident_bytes=budget)
        before, most = rss_file_kb(), 0
        for start in range(0, rows, 4096):
            split[order[start : start + 4096]]
            most = max(most, rss_file_kb() - before)
        return most * 1024

    assert mapped_in(1 << 40) > 100 << 20  # no budget: every page of the data ends up held
    assert mapped_in(16 << 20) < 48 << 20  # the budget, a batch's worth and the page cache's rounding


def test_a_changed_or_missing_shard_is_one_line_naming_it(tmp_path: Path):
    shards = written(tmp_path, np.ones((10, 2), np.float32), np.arange(10), shard_bytes=1 << 20)
    damaged = tmp_path / shards[0].inputs
    original = damaged.read_bytes()
    damaged.write_bytes(original[:-1] + b"\x01")
    with pytest.raises(InputError, match=r"train-00000.inputs.npy: sha256 differs from the manifest"):
        open_split(tmp_path, shards)
    damaged.write_bytes(original)
    (tmp_path / shards[0].targets).unlink()
    with pytest.raises(InputError, match=r"train-00000.targets.npy: cannot read the shard"):
        open_split(tmp_path, shards)


def test_inputs_and_targets_of_other_lengths_are_refused(tmp_path: Path):
    with pytest.raises(InputError, match="3 inputs beside 2 targets"):
        split_shards("train", np.ones((3, 2), np.float32), np.arange(2))
