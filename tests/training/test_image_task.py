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
from PIL import Image

from core.errors import InputError
from training.data.splits import SPLIT_NAMES, SplitFractions, assign_splits
from training.tasks.image.manifest import read_manifest, read_split
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

    assert sorted(path.name for path in out.iterdir()) == sorted(
        ["manifest.json", *(f"{name}.{suffix}" for name in SPLIT_NAMES for suffix in ("npy", "json"))]
    )
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
    assert (tmp_path / "one" / "train.npy").read_bytes() == (tmp_path / "two" / "train.npy").read_bytes()
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
    for name in SPLIT_NAMES:
        assert (tmp_path / "v2" / f"{name}.npy").read_bytes() == (
            tmp_path / "full" / f"{name}.npy"
        ).read_bytes()


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
    shutil.copyfile(version / "test.npy", version / "train.npy")


@pytest.mark.parametrize(
    ("previous_size", "spoil", "reason"),
    [
        (SIZE, overwrite_train_with_test, "train.npy: sha256 differs"),
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

    pixels = bytearray((out / "validation.npy").read_bytes())
    pixels[-1] ^= 0xFF
    (out / "validation.npy").write_bytes(bytes(pixels))
    with pytest.raises(InputError, match=r"validation\.npy: sha256 differs from the manifest"):
        ImageTask(size=16).load(out)

    manifest = json.loads((out / "manifest.json").read_text())
    manifest["classes"][0] = "oval"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="the manifest was edited"):
        ImageTask(size=16).load(out)


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
