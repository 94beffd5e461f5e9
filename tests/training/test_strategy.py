"""Which modules FSDP shards as units: the task's `fsdp_modules` hook, checked, or the size-based default."""

from __future__ import annotations

import pytest
from torch import nn

from core.errors import InputError
from training.engine.strategy import default_units, task_units


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
