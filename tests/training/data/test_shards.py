"""Array shards: a split written in bounded files and read back by the engine's indices, with what a process
holds of it bounded by a budget rather than by the data."""

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


def rss_kb() -> int:
    """What this process holds (/proc/self/status VmRSS): its own memory and any file pages it maps."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("budget", [1 << 30, 0], ids=["held", "read-per-batch"])
def test_a_batch_is_exactly_the_rows_asked_for_across_shards(tmp_path: Path, budget: int):
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((1000, 3, 4)).astype(np.float32)
    targets = rng.integers(0, 10, 1000)
    shards = written(tmp_path, inputs, targets, shard_bytes=48 * 100)  # 100 rows a shard
    split = open_split(tmp_path, shards, resident_bytes=budget)
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

    def held(budget: int) -> int:
        before, most = rss_kb(), 0
        split = open_split(tmp_path, shards, resident_bytes=budget)
        for start in range(0, rows, 4096):
            batch = split[order[start : start + 4096]]
            most = max(most, rss_kb() - before)
            del batch
        del split
        return most * 1024

    assert held(1 << 40) > 100 << 20  # within the budget: the split is held, all of it
    assert held(16 << 20) < 32 << 20  # beyond it: a batch or two (16 MiB each), never the data


@pytest.mark.parametrize("budget", [1 << 30, 0], ids=["held", "read-per-batch"])
def test_dead_rows_are_left_out_and_the_rest_keep_their_order(tmp_path: Path, budget: int):
    """What the training sampler indexes is the live rows in shard order, whichever way they are read."""
    rng = np.random.default_rng(3)
    inputs = rng.standard_normal((300, 5)).astype(np.float32)
    targets = np.arange(300)
    shards = written(tmp_path, inputs, targets, shard_bytes=20 * 100)  # three shards of 100 rows
    dead = [np.array([0, 5, 99]), None, np.arange(100)]  # the last shard entirely superseded
    live = np.concatenate([np.setdiff1d(np.arange(100), dead[0]), np.arange(100, 200)])
    split = open_split(tmp_path, shards, resident_bytes=budget, dead=dead)
    order = torch.from_numpy(rng.permutation(len(live)))

    batch_inputs, batch_targets = split[order]

    assert len(split) == len(live) == 197
    assert np.array_equal(batch_targets.numpy(), live[order.numpy()])
    assert np.array_equal(batch_inputs.numpy(), inputs[live[order.numpy()]])
    with pytest.raises(InputError, match=r"expected increasing positions in \[0, 100\)"):
        open_split(tmp_path, shards, dead=[np.array([5, 5]), None, None])


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
