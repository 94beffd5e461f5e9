"""Which modules FSDP shards as units: the task's `fsdp_modules` hook, checked, or the size-based default;
and the finiteness check of the weights every save runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.errors import InputError
from training.checkpoint.manager import finite_weights_check
from training.engine.strategy import default_units, task_units, tensors_finite


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.outer = nn.Linear(width, width)

    def forward(self, x):
        return self.outer(self.inner(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 256)  # 2,304 parameters: below the threshold, left to the root
        self.blocks = nn.ModuleList([Block(256), Block(256)])  # 131,584 parameters each
        self.head = nn.Linear(256, 4)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_by_default_each_submodule_reaching_the_size_is_a_unit_innermost_first_never_a_container():
    model = Net()
    units = default_units(model, min_parameters=100_000)
    assert units == [model.blocks[0], model.blocks[1]]  # not the ModuleList: it has no forward
    # Below a block's size, its linears are units, and the block keeps nothing of its own to shard.
    smaller = default_units(model, min_parameters=60_000)
    assert smaller == [
        model.blocks[0].inner,
        model.blocks[0].outer,
        model.blocks[1].inner,
        model.blocks[1].outer,
    ]
    assert default_units(model, min_parameters=10**9) == []  # a small model: the root alone


class HookedTask:
    name = "hooked"

    def __init__(self, pick) -> None:
        self.pick = pick

    def fsdp_modules(self, model):
        return self.pick(model)


def test_a_tasks_hook_names_the_units_and_anything_but_submodules_is_refused_in_one_line():
    model = Net()
    assert task_units(HookedTask(lambda m: [m.head, m.blocks[1]]), model) == [model.head, model.blocks[1]]
    assert task_units(object(), model) == default_units(model)
    for wrong in (lambda m: [m], lambda m: [nn.Linear(2, 2)], lambda m: ["blocks"]):
        with pytest.raises(InputError, match="fsdp_modules\\(model\\) must return submodules of the model"):
            task_units(HookedTask(wrong), model)


# -- are the weights finite? -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_non_finite_value_anywhere_is_found(dtype, bad):
    tensors = [torch.randn(1000, dtype=dtype), torch.ones(3, 7, dtype=dtype), torch.arange(5)]
    assert tensors_finite(tensors)
    tensors[1][2, 6] = bad
    assert not tensors_finite(tensors)


@pytest.mark.parametrize(
    ("dtype", "big"), [(torch.float32, 3e38), (torch.float16, 60000.0), (torch.bfloat16, 3e38)]
)
def test_finite_values_whose_sum_overflows_are_still_finite(dtype, big):
    assert tensors_finite([torch.full((4,), big, dtype=dtype), torch.full((4,), -big, dtype=dtype)])
    assert not bool(torch.full((4,), big, dtype=dtype).sum().isfinite())  # the fast sum alone would say no


def test_nothing_floating_is_finite():
    assert tensors_finite([]) and tensors_finite([torch.zeros(0), torch.tensor([1, 2])])


class Masked(Net):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.full((4, 4), float("-inf")).triu(1))  # infinite on purpose


def test_the_save_check_covers_every_parameter_of_the_state_and_no_buffer():
    model = Masked()
    check = finite_weights_check(model)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert check({"model": state}) is None  # the infinite mask is a buffer
    for name, _ in model.named_parameters():
        poisoned = dict(state)
        poisoned[name] = state[name].clone().view(-1).index_fill(0, torch.tensor([0]), float("nan"))
        assert check({"model": poisoned}) == "the weights it left are not finite", name
