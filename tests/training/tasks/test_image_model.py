"""The image task behind the contract: loading, the CNN, the loss with its augmentation, scoring, and serving
what a caller has (a uint8 N×H×W×3 array)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from core.errors import InputError
from training.data.shards import ShardSplit
from training.data.splits import SplitFractions
from training.tasks.base import Task, missing_parts
from training.tasks.classification import score_classifier
from training.tasks.image.manifest import read_manifest, read_split
from training.tasks.image.model import InChunks, augment
from training.tasks.image.sample_data import SHAPES, write_sample_images
from training.tasks.image.task import ImageSplit, ImageTask
from training.tasks.loader import load_task

SIZE = 16


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    write_sample_images(root / "raw", per_class=60, seed=0, side=24)
    ImageTask(size=SIZE).prepare(root / "raw", root / "prepared", previous=None, split=SplitFractions())
    return root / "prepared"


def whole(split) -> tuple[torch.Tensor, torch.Tensor]:
    """Every image of a split and its class, as one batch."""
    return split[torch.arange(len(split))]


def scaled_whole(pixels: np.ndarray) -> torch.Tensor:
    """What the model was given before the task read shards: the whole split scaled at once."""
    return torch.from_numpy(pixels).to(torch.float32).div(255.0).permute(0, 3, 1, 2).contiguous()


@pytest.fixture(scope="module")
def task() -> ImageTask:
    return ImageTask(size=SIZE, width=16)


def test_the_image_task_is_a_complete_task_found_by_its_built_in_name():
    assert missing_parts(ImageTask()) == []
    task = load_task("image")
    assert isinstance(task, ImageTask) and isinstance(task, Task)
    assert task.options() == {"size": [32, 32], "width": 32, "dropout": 0.1, "augment": True}
    assert load_task("image", {"size": [16, 24], "augment": False}).options()["size"] == [16, 24]
    assert task.raw_suffixes == (".png", ".jpg", ".jpeg")
    assert task.metrics.find(task.default_primary_metric).direction == "higher"
    assert task.metrics.direction("loss") == "lower" and task.metrics.direction("recall_3") == "higher"


@pytest.mark.parametrize(
    ("options", "named"),
    [({"size": 4}, "size=4"), ({"size": [16, 16, 3]}, "size=[16, 16, 3]"), ({"width": 2.5}, "width=2.5"),
     ({"dropout": 1.0}, "dropout=1.0"), ({"augment": "yes"}, "augment='yes'")],
)  # fmt: skip
def test_a_bad_option_is_refused_with_the_form_it_should_take(options, named):
    with pytest.raises(InputError, match="expected") as raised:
        load_task("image", options)
    assert "--task 'image'" in str(raised.value) and named in str(raised.value)


def test_load_maps_each_split_and_gives_batches_of_scaled_pixels_and_the_facts_the_model_is_built_from(
    prepared, task
):
    data = task.load(prepared)
    manifest = read_manifest(prepared)

    assert data.data_version == manifest.data_version
    assert data.info == {
        "size": [SIZE, SIZE],
        "classes": list(SHAPES),
        "channel_mean": list(manifest.channel_mean),
        "channel_std": list(manifest.channel_std),
    }
    train = data.split("train")
    assert isinstance(train, ImageSplit) and isinstance(train.pixels, ShardSplit)  # mapped, not read whole
    inputs, targets = whole(train)
    assert inputs.dtype == torch.float32 and inputs.shape == (len(train), 3, SIZE, SIZE)
    assert targets.dtype == torch.int64
    assert inputs.min() >= 0.0 and inputs.max() <= 1.0
    stored = read_split(prepared, manifest, "train")
    # Batch by batch, the very float32 values the whole split scaled at once gave the model.
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(train)))
    before = scaled_whole(stored.pixels)
    for rows in order.split(16):
        images, labels = train[rows]
        assert torch.equal(images, before[rows]) and labels.tolist() == stored.labels[rows.numpy()].tolist()
    image, label = train[-1]
    assert torch.equal(image, before[-1]) and int(label) == stored.labels[-1]


def test_the_model_carries_the_normalisation_and_answers_one_logit_per_class(prepared, task):
    data = task.load(prepared)
    torch.manual_seed(0)
    model = task.build_model(data.info)

    torch.manual_seed(0)
    rebuilt = task.build_model(data.info)

    state = model.state_dict()
    assert torch.allclose(state["channel_mean"].flatten(), torch.tensor(data.info["channel_mean"]))
    assert torch.allclose(state["channel_std"].flatten(), torch.tensor(data.info["channel_std"]))
    assert all(torch.equal(value, rebuilt.state_dict()[name]) for name, value in state.items())
    assert model.eval()(whole(data.split("test"))[0]).shape == (len(data.split("test")), len(SHAPES))
    with pytest.raises(InputError, match="at least 2 class names"):
        task.build_model({**data.info, "classes": ["circle"]})


def test_augmentation_flips_and_moves_each_image_within_itself_and_is_drawn_from_the_seed():
    images = torch.rand(8, 3, 12, 12)
    torch.manual_seed(3)
    first = augment(images)
    torch.manual_seed(3)
    second = augment(images)

    assert torch.equal(first, second)
    assert first.shape == images.shape and not torch.equal(first, images)
    for original, moved in zip(images, first, strict=True):
        # Flips, shifts and repeated edges only rearrange an image's own pixels (RGB triples).
        own = {tuple(pixel) for pixel in original.permute(1, 2, 0).reshape(-1, 3).tolist()}
        assert {tuple(pixel) for pixel in moved.permute(1, 2, 0).reshape(-1, 3).tolist()} <= own


def test_the_loss_augments_only_while_training_and_repeats_under_the_same_seed(prepared):
    data = ImageTask(size=SIZE, width=8).load(prepared)
    batch = data.split("train")[torch.arange(16)]
    augmenting, plain = (
        ImageTask(size=SIZE, width=8, dropout=0.0),
        ImageTask(size=SIZE, width=8, augment=False),
    )
    torch.manual_seed(0)
    model = augmenting.build_model(data.info)

    model.train()
    losses = []
    for task in (augmenting, augmenting, plain):
        torch.manual_seed(11)
        losses.append(task.loss(model, batch).item())
    model.eval()
    expected = nn.functional.cross_entropy(model(batch[0]), batch[1]).item()

    assert losses[0] == losses[1] != losses[2]
    assert augmenting.loss(model, batch).item() == expected == plain.loss(model, batch).item()


def test_score_reports_every_declared_metric_and_leaves_the_model_in_its_mode(prepared, task):
    data = task.load(prepared)
    torch.manual_seed(0)
    model = task.build_model(data.info)
    test = data.split("test")

    model.eval()
    with torch.no_grad():
        metrics = task.score(model, test)
    assert not model.training
    assert {"accuracy", "macro_f1", "loss"} <= set(metrics)
    assert all(task.metrics.find(name) is not None for name in metrics)
    recalls = {name for name in metrics if name.startswith("recall_")}
    inputs, targets = whole(test)
    assert recalls == {f"recall_{label}" for label in targets.unique().tolist()}
    logits = model(inputs)
    assert metrics["accuracy"] == pytest.approx((logits.argmax(1) == targets).float().mean().item())
    # The numbers the task gave when it scored the split held whole in memory, exactly.
    stored = read_split(prepared, read_manifest(prepared), "test")
    assert metrics == score_classifier(
        InChunks(model), scaled_whole(stored.pixels), torch.from_numpy(stored.labels)
    )
    model.train()
    task.score(model, test)
    assert model.training


def test_predict_answers_class_names_for_uint8_images_and_names_the_shape_it_expects(prepared, task):
    data = task.load(prepared)
    torch.manual_seed(0)
    model = task.build_model(data.info).eval()
    example = task.input_example(data)
    test = data.split("test")

    assert example.dtype == np.uint8 and example.shape == (4, SIZE, SIZE, 3)
    stored = read_split(prepared, read_manifest(prepared), "test")
    assert np.array_equal(example, stored.pixels[:4])
    answers = task.predict(model, data.info, example)
    with torch.no_grad():
        expected = [SHAPES[index] for index in model(test[torch.arange(4)][0]).argmax(1).tolist()]
    assert answers == expected
    assert task.predict(model, data.info, example[1]) == answers[1:2]
    floats = example.astype(np.float32)
    assert task.predict(model, data.info, floats) == answers
    assert np.array_equal(floats, example)  # the caller's array is left as it was
    for bad in (example[:, :8], example[..., :1], np.zeros((0, SIZE, SIZE, 3), np.uint8)):
        with pytest.raises(InputError, match=rf"shape N×{SIZE}×{SIZE}×3"):
            task.predict(model, data.info, bad)
    with pytest.raises(InputError, match=r"outside 0\.\.255"):
        task.predict(model, data.info, example.astype(np.int16) * 3)


def test_the_cnn_learns_the_shapes_in_a_short_cpu_run(prepared):
    task = ImageTask(size=SIZE, width=16)
    data = task.load(prepared)
    torch.manual_seed(0)
    model = task.build_model(data.info)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    train = data.split("train")
    epochs, batch = 10, 32
    steps = epochs * -(-len(train) // batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(train))
        for start in range(0, len(order), batch):
            loss = task.loss(model, train[order[start : start + batch]])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()

    model.eval()
    with torch.no_grad():
        metrics = task.score(model, data.split("test"))
    assert metrics["accuracy"] >= 0.9 and metrics["macro_f1"] >= 0.9


def test_training_steps_reseeded_per_step_resume_to_the_same_weights(prepared):
    """The engine reseeds torch's default generator before every step; the task keeps no other randomness,
    so steps 0-3 in one go and steps 0-1, a save, a rebuild and steps 2-3 end with the same weights."""
    task = ImageTask(size=SIZE, width=8, dropout=0.2)
    data = task.load(prepared)
    train = data.split("train")

    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = task.build_model(data.info).train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def run(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
        for step in steps:
            torch.manual_seed(1000 + step)
            loss = task.loss(model, train[torch.arange(step * 16, step * 16 + 16)])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    torch.use_deterministic_algorithms(True)
    try:
        straight, straight_optimizer = fresh()
        run(straight, straight_optimizer, range(4))
        first, first_optimizer = fresh()
        run(first, first_optimizer, range(2))
        saved = {"model": first.state_dict(), "optimizer": first_optimizer.state_dict()}
        resumed, resumed_optimizer = fresh()
        resumed.load_state_dict(saved["model"])
        resumed_optimizer.load_state_dict(saved["optimizer"])
        run(resumed, resumed_optimizer, range(2, 4))
    finally:
        torch.use_deterministic_algorithms(False)

    final = resumed.state_dict()
    assert all(torch.equal(value, final[name]) for name, value in straight.state_dict().items())
    assert not torch.equal(straight.state_dict()["head.1.weight"], fresh()[0].state_dict()["head.1.weight"])
