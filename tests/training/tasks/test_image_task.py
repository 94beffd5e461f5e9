"""The image task's preparation: class folders of PNG/JPEG files in, a verified, content-versioned data
version out; incremental, stable as data grows, and refusing bad input with one line and nothing written."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from core.errors import InputError
from training.data.publish import publish
from training.data.splits import SPLIT_NAMES, SplitFractions, assign_splits
from training.tasks.image.manifest import (
    ImageManifest,
    PrepStats,
    SplitArrays,
    read_manifest,
    read_split,
    split_files,
)
from training.tasks.image.prepare import prepare_images
from training.tasks.image.raw_images import decode_image
from training.tasks.image.sample_data import SHAPES, write_sample_images
from training.tasks.image.task import ImageTask

SIZE = (16, 16)
SPLIT = SplitFractions()


def prepare(raw: Path, out: Path, previous: Path | None = None, size: tuple[int, int] = SIZE):
    return prepare_images(raw, out, size=size, previous=previous, split=SPLIT)


def split_of_each_key(prepared: Path) -> dict[str, str]:
    manifest = read_manifest(prepared)
    return {key: name for name in SPLIT_NAMES for key in read_split(prepared, manifest, name).keys}


def content(prepared: Path) -> dict:
    """The manifest without what says when, from what and how it was made."""
    document = json.loads((prepared / "manifest.json").read_text())
    return {
        key: value
        for key, value in document.items()
        if key not in ("created_at", "previous_version", "stats")
    }


def files_of(prepared: Path) -> dict[str, bytes]:
    """Every file of a version but its manifest (which says when it was made), by name."""
    return {path.name: path.read_bytes() for path in prepared.iterdir() if path.name != "manifest.json"}


def png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    write_sample_images(tmp_path / "raw", per_class=12, seed=0, side=20)
    return tmp_path / "raw"


def test_prepare_writes_each_split_its_files_and_a_manifest_of_content_hashes(raw, tmp_path):
    manifest = prepare(raw, tmp_path / "prepared")
    out = tmp_path / "prepared"

    assert sorted(path.name for path in out.iterdir()) == sorted([
        "manifest.json",
        *(f"{name}.keys.json" for name in SPLIT_NAMES),
        *(f"{name}-00000.{part}.npy" for name in SPLIT_NAMES for part in ("inputs", "targets")),
    ])  # fmt: skip
    assert manifest.classes == SHAPES
    files = sorted(raw.glob("*/*.png"))
    assert [entry.key for entry in manifest.raw_files] == sorted(f"{p.parent.name}/{p.name}" for p in files)
    for entry in manifest.raw_files:
        assert entry.sha256 == hashlib.sha256((raw / entry.key).read_bytes()).hexdigest()
    assert read_manifest(out) == manifest
    assert manifest.stats.images == len(files) == manifest.stats.decoded
    rows = {name: read_split(out, manifest, name) for name in SPLIT_NAMES}
    assert sum(len(split) for split in rows.values()) == len(files)
    for split in rows.values():
        assert split.pixels.shape == (len(split), *SIZE, 3) and split.pixels.dtype == np.uint8
        assert list(split.keys) == sorted(split.keys)
        for key, label, pixels in zip(split.keys, split.labels, split.pixels, strict=True):
            assert manifest.classes[label] == key.split("/")[0]
            assert np.array_equal(pixels, decode_image(raw / key, SIZE))
    train = rows["train"].pixels.reshape(-1, 3) / 255.0
    assert np.allclose(manifest.channel_mean, train.mean(axis=0))
    assert np.allclose(manifest.channel_std, train.std(axis=0))


def test_the_data_version_depends_on_content_only(raw, tmp_path):
    first = prepare(raw, tmp_path / "one")
    second = prepare(raw, tmp_path / "two")
    again = prepare(raw, tmp_path / "one")  # the same version already there: nothing to do
    other_size = prepare(raw, tmp_path / "three", size=(12, 12))

    assert first.data_version == second.data_version == again.data_version
    assert files_of(tmp_path / "one") == files_of(tmp_path / "two")
    assert other_size.data_version != first.data_version
    with pytest.raises(InputError, match="already holds data version"):
        prepare(raw, tmp_path / "three")


def test_incremental_prepare_decodes_only_new_or_changed_images_and_equals_a_full_one(raw, tmp_path, caplog):
    prepare(raw, tmp_path / "v1")
    added = write_sample_images(raw, per_class=5, seed=1, side=20)
    changed = raw / "circle" / "circle-s0-0000.png"
    changed.write_bytes(png_bytes(np.full((20, 20, 3), 200, dtype=np.uint8)))
    caplog.set_level(logging.INFO, logger="training.tasks.image.prepare")

    incremental = prepare(raw, tmp_path / "v2", previous=tmp_path / "v1")
    full = prepare(raw, tmp_path / "full")

    assert (incremental.stats.decoded, incremental.stats.reused) == (len(added) + 1, 4 * 12 - 1)
    assert full.stats.decoded == 4 * 17
    assert any(f"decoded {len(added) + 1}, reused {4 * 12 - 1}" in message for message in caplog.messages)
    assert incremental.data_version == full.data_version
    assert incremental.previous_version == read_manifest(tmp_path / "v1").data_version
    assert content(tmp_path / "v2") == content(tmp_path / "full")
    assert files_of(tmp_path / "v2") == files_of(tmp_path / "full")


def test_an_image_keeps_its_split_as_data_grows(raw, tmp_path):
    prepare(raw, tmp_path / "v1")
    write_sample_images(raw, per_class=20, seed=7, side=20)
    prepare(raw, tmp_path / "v2", previous=tmp_path / "v1")

    before, after = split_of_each_key(tmp_path / "v1"), split_of_each_key(tmp_path / "v2")
    assert len(after) == len(before) + 4 * 20
    assert all(after[key] == name for key, name in before.items())
    keys = sorted(after)
    assigned = assign_splits(keys, SPLIT)
    assert all(after[key] == SPLIT_NAMES[index] for key, index in zip(keys, assigned, strict=True))


def overwrite_train_with_test(version: Path) -> None:
    shutil.copyfile(version / "test-00000.inputs.npy", version / "train-00000.inputs.npy")


@pytest.mark.parametrize(
    ("previous_size", "spoil", "reason"),
    [
        (SIZE, overwrite_train_with_test, "train-00000.inputs.npy: sha256 differs"),
        ((12, 12), None, "prepared at 12x12, not 16x16"),
    ],
    ids=["tampered", "other-size"],
)
def test_a_previous_version_that_cannot_be_trusted_or_used_is_not_reused(
    raw, tmp_path, caplog, previous_size, spoil, reason
):
    prepare(raw, tmp_path / "v1", size=previous_size)
    if spoil is not None:
        spoil(tmp_path / "v1")
    caplog.set_level(logging.WARNING, logger="training.tasks.image.prepare")

    manifest = prepare(raw, tmp_path / "v2", previous=tmp_path / "v1")

    assert manifest.stats.decoded == 4 * 12
    assert manifest.data_version == prepare(raw, tmp_path / "full").data_version
    assert any(reason in message and "decoding every image" in message for message in caplog.messages)


def test_hidden_and_non_image_files_are_skipped_and_suffixes_are_case_insensitive(raw, tmp_path):
    (raw / "README.txt").write_text("about these images")
    (raw / ".staging").mkdir()
    (raw / "circle" / ".circle-new.png.partial").write_bytes(b"half an image")
    (raw / "circle" / "notes.txt").write_text("not an image")
    Image.fromarray(np.full((20, 20, 3), 90, dtype=np.uint8)).save(
        raw / "square" / "PHOTO.JPG", format="JPEG"
    )

    manifest = prepare(raw, tmp_path / "prepared")

    keys = [entry.key for entry in manifest.raw_files]
    assert "square/PHOTO.JPG" in keys
    assert len(keys) == 4 * 12 + 1
    assert manifest.classes == SHAPES


def not_an_image(raw: Path) -> Path:
    path = raw / "cross" / "fake.png"
    path.write_text("this is text, not a PNG")
    return path


def empty_file(raw: Path) -> Path:
    path = raw / "square" / "empty.jpg"
    path.write_bytes(b"")
    return path


def truncated_png(raw: Path) -> Path:
    path = raw / "triangle" / "cut.png"
    noise = np.random.default_rng(0).integers(0, 256, size=(20, 20, 3), dtype=np.uint8)
    whole = png_bytes(noise)
    path.write_bytes(whole[: len(whole) // 2])
    return path


def loose_image(raw: Path) -> Path:
    return Path(shutil.copyfile(raw / "circle" / "circle-s0-0001.png", raw / "unsorted.png"))


def non_utf8_name(raw: Path) -> Path:
    name = os.fsencode(raw / "circle") + b"/caf\xe9.png"  # Latin-1, not UTF-8
    descriptor = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(descriptor, (raw / "circle" / "circle-s0-0001.png").read_bytes())
    os.close(descriptor)
    return Path(os.fsdecode(name))


def one_class(raw: Path) -> Path:
    for shape in SHAPES[1:]:
        shutil.rmtree(raw / shape)
    return raw


def too_few_images(raw: Path) -> Path:
    for path in raw.glob("*/*.png"):
        if not path.name.endswith("-0000.png"):
            path.unlink()
    return raw


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (not_an_image, "not a readable image"),
        (empty_file, "the file is empty"),
        (truncated_png, "not a readable image"),
        (loose_image, "has no class"),
        (non_utf8_name, "not valid UTF-8"),
        (one_class, "expected at least 2 classes"),
        (too_few_images, "split empty"),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_bad_input_is_one_line_naming_the_file_and_the_form_and_nothing_is_written(
    raw, tmp_path, make, expected
):
    culprit = make(raw)

    with pytest.raises(InputError) as raised:
        prepare(raw, tmp_path / "out" / "prepared")

    message = str(raised.value)
    assert expected in message and "expected" in message
    assert "\n" not in message
    shown = repr(os.fsencode(culprit.name)) if expected == "not valid UTF-8" else culprit.name
    assert shown in message
    assert not (tmp_path / "out").exists()


def test_load_refuses_changed_files_and_a_size_other_than_the_tasks(raw, tmp_path):
    out = tmp_path / "prepared"
    prepare(raw, out)
    with pytest.raises(InputError, match=r"size=\[16, 16\]"):
        ImageTask(size=24).load(out)

    pixels = bytearray((out / "validation-00000.inputs.npy").read_bytes())
    pixels[-1] ^= 0xFF
    (out / "validation-00000.inputs.npy").write_bytes(bytes(pixels))
    with pytest.raises(InputError, match=r"validation-00000\.inputs\.npy: sha256 differs from the manifest"):
        ImageTask(size=16).load(out)

    manifest = json.loads((out / "manifest.json").read_text())
    manifest["classes"][0] = "oval"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="the manifest was edited"):
        ImageTask(size=16).load(out)


def test_smaller_shards_make_the_same_version_and_the_same_batches_and_are_built_on(raw, tmp_path):
    one = prepare(raw, tmp_path / "one")
    many = prepare_images(raw, tmp_path / "many", size=SIZE, split=SPLIT, shard_bytes=5 * 16 * 16 * 3)

    assert many.data_version == one.data_version  # the version is what the splits hold, not their files
    train = many.split_entry("train")
    assert len(train.shards) == -(-train.images // 5) > 1
    assert [shard.rows for shard in train.shards[:-1]] == [5] * (len(train.shards) - 1)
    whole, cut = ImageTask(size=16).load(tmp_path / "one"), ImageTask(size=16).load(tmp_path / "many")
    for name in SPLIT_NAMES:
        rows = torch.from_numpy(np.random.default_rng(0).permutation(len(whole.split(name))))
        for expected, got in zip(whole.split(name)[rows], cut.split(name)[rows], strict=True):
            assert torch.equal(expected, got)
    write_sample_images(raw, per_class=2, seed=3, side=20)
    built_on = prepare(raw, tmp_path / "next", previous=tmp_path / "many")  # copies from every shard
    assert built_on.stats.reused == 4 * 12
    assert built_on.data_version == prepare(raw, tmp_path / "full").data_version


def test_a_version_of_the_earlier_format_is_refused_by_load_and_not_built_on(raw, tmp_path, caplog):
    prepare(raw, tmp_path / "old")
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    manifest["format"] = "retrain-image-prepared/1"
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    caplog.set_level(logging.WARNING, logger="training.tasks.image.prepare")

    with pytest.raises(InputError) as refused:
        ImageTask(size=16).load(tmp_path / "old")
    built = prepare(raw, tmp_path / "new", previous=tmp_path / "old")

    message = str(refused.value)
    assert "'retrain-image-prepared/1' is not 'retrain-image-prepared/2'" in message and "\n" not in message
    assert message.endswith("re-run `retrain prepare --task image` to write a fresh data version")
    assert built.stats.decoded == 4 * 12 and built.previous_version is None
    assert any(
        "retrain-image-prepared/1" in line and "decoding every image" in line for line in caplog.messages
    )


def replaced_shard(version: Path, split: str, part: str, array: np.ndarray) -> str:
    """Write `array` as the split's first shard file `part`, with its sha256 in the manifest (which the data
    version does not hash, so the manifest still reads): shards that verify but do not hold the split."""
    name = f"{split}-00000.{part}.npy"
    np.save(version / name, array, allow_pickle=False)
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["splits"][split]["shards"][0][f"{part}_sha256"] = hashlib.sha256(
        (version / name).read_bytes()
    ).hexdigest()
    (version / "manifest.json").write_text(json.dumps(manifest))
    return name


@pytest.mark.parametrize(
    ("part", "array_of", "expected"),
    [
        (
            "targets",
            lambda labels, pixels: np.concatenate([[7], labels[1:]]),
            "targets.npy: class indices outside 0..3",
        ),
        ("inputs", lambda labels, pixels: pixels[:, :8, :8], "inputs.npy: holds uint8 (6, 8, 8, 3)"),
        ("inputs", lambda labels, pixels: pixels[:-1], "targets.npy: not one target per input row"),
    ],
    ids=["class-outside", "other-size", "fewer-rows"],
)
def test_shards_that_verify_but_do_not_hold_what_the_manifest_says_are_refused_in_one_line(
    raw, tmp_path, part, array_of, expected
):
    out = tmp_path / "prepared"
    prepare(raw, out)
    labels = np.load(out / "test-00000.targets.npy")
    pixels = np.load(out / "test-00000.inputs.npy")
    assert len(labels) == 6  # the cases name this count
    replaced_shard(out, "test", part, array_of(labels, pixels))

    with pytest.raises(InputError) as refused:
        ImageTask(size=16).load(out)

    message = str(refused.value)
    assert expected in message and "re-run `retrain prepare --task image`" in message and "\n" not in message


def rss_anon_bytes() -> int:
    """The memory this process allocated itself (/proc/self/status RssAnon), not the mapped files' pages."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_loading_and_reading_every_batch_allocates_a_batch_not_the_split(tmp_path):
    """Every image of a 70 MiB train split (281 MiB as the model's float32), beyond the budget a split may
    hold, batch by batch in a shuffled order as the engine reads them: the pixels stay in the shards (the
    page cache, which the ranks of a node share), and the process allocates about a batch, not the split
    it used to hold."""
    images, side = 24_000, 32
    row = np.arange(side * side * 3, dtype=np.uint8).reshape(side, side, 3)
    pixels = np.broadcast_to(row, (images, side, side, 3))
    labels = np.arange(images, dtype=np.int64) % 2
    arrays = {
        "train": SplitArrays(tuple(f"a/{n:06d}.png" for n in range(images)), labels, pixels),
        **{
            name: SplitArrays(("a/x.png", "b/y.png"), np.array([0, 1]), pixels[:2])
            for name in SPLIT_NAMES[1:]
        },
    }
    files, entries = {}, []
    for name in SPLIT_NAMES:
        payload, entry = split_files(name, arrays[name])
        files.update(payload)
        entries.append(entry)
    manifest = ImageManifest(
        size=(side, side), classes=("a", "b"), split=SPLIT, raw_files=(), splits=tuple(entries),
        channel_mean=(0.5, 0.5, 0.5), channel_std=(0.25, 0.25, 0.25),
        stats=PrepStats(images=images + 4, decoded=images + 4, reused=0), decoder="synthetic",
        previous_version=None, created_at="2026-01-01T00:00:00+00:00",
    )  # fmt: skip
    publish(tmp_path / "big", {**files, "manifest.json": manifest.to_json().encode()})
    del files, payload

    before = rss_anon_bytes()
    train = ImageTask(size=side).load(tmp_path / "big").split("train")
    most = rss_anon_bytes() - before
    order = torch.from_numpy(np.random.default_rng(0).permutation(images))
    for rows in order.split(256):
        batch, classes = train[rows]
        most = max(most, rss_anon_bytes() - before)

    assert torch.equal(batch, scaled(pixels[rows.numpy()])) and torch.equal(
        classes, torch.from_numpy(labels)[rows]
    )
    assert 4 * pixels.size > 280 << 20  # the split as float32 inputs, which the task held before
    assert most < 32 << 20, most


def scaled(pixels: np.ndarray) -> torch.Tensor:
    """Pixels as the model's input, as the task scaled the whole split before it read shards."""
    return torch.from_numpy(np.array(pixels)).to(torch.float32).div(255.0).permute(0, 3, 1, 2)


def test_sample_images_are_drawn_from_the_seed_and_never_overwritten(tmp_path):
    first = write_sample_images(tmp_path / "a", per_class=3, seed=4)
    second = write_sample_images(tmp_path / "b", per_class=3, seed=4)
    other = write_sample_images(tmp_path / "a", per_class=3, seed=5)

    assert [path.read_bytes() for path in first] == [path.read_bytes() for path in second]
    assert {path.read_bytes() for path in first}.isdisjoint(path.read_bytes() for path in other)
    assert {path.parent.name for path in first} == set(SHAPES)
    assert np.asarray(Image.open(first[0])).shape == (32, 32, 3)
    with pytest.raises(InputError, match="never overwritten"):
        write_sample_images(tmp_path / "a", per_class=3, seed=4)
