import pytest
import torch

from core.errors import InputError
from training.engine.sampling import BatchPlan, DataCursor, epoch_permutation, rank_batch_indices, step_seed


def test_epoch_permutation_is_a_pure_function_of_seed_and_epoch():
    first = epoch_permutation(seed=7, epoch=3, dataset_size=100)
    assert torch.equal(first, epoch_permutation(seed=7, epoch=3, dataset_size=100))
    assert sorted(first.tolist()) == list(range(100))
    assert not torch.equal(first, epoch_permutation(seed=7, epoch=4, dataset_size=100))
    assert not torch.equal(first, epoch_permutation(seed=8, epoch=3, dataset_size=100))


def test_cursor_walks_whole_global_batches_and_drops_the_incomplete_tail():
    plan = BatchPlan(dataset_size=10, global_batch_size=4)
    assert plan.steps_per_epoch == 2
    cursor = DataCursor()
    visited = []
    for _ in range(5):
        visited.append((cursor.epoch, cursor.position))
        cursor = cursor.advance(plan)
    assert visited == [(0, 0), (0, 4), (1, 0), (1, 4), (2, 0)]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ranks_share_exactly_the_global_batch_whatever_the_world_size(world_size):
    plan = BatchPlan(dataset_size=50, global_batch_size=8)
    permutation = epoch_permutation(seed=1, epoch=0, dataset_size=50)
    cursor = DataCursor(epoch=0, position=16)
    shares = [rank_batch_indices(permutation, cursor, plan, rank, world_size) for rank in range(world_size)]
    assert torch.cat(shares).tolist() == permutation[16:24].tolist()


def test_batch_plan_rejects_sizes_it_cannot_serve():
    with pytest.raises(InputError, match="not divisible by 3 processes"):
        BatchPlan(dataset_size=100, global_batch_size=8).per_rank_batch_size(3)
    with pytest.raises(InputError, match="larger than the training split"):
        BatchPlan(dataset_size=5, global_batch_size=8)
    with pytest.raises(InputError, match="expected a positive integer"):
        BatchPlan(dataset_size=5, global_batch_size=0)


def test_step_seeds_differ_by_step_and_rank_and_repeat_exactly():
    seeds = {step_seed(0, step, rank) for step in range(50) for rank in range(4)}
    assert len(seeds) == 200
    assert step_seed(3, 10, 1) == step_seed(3, 10, 1)
