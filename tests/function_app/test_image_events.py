"""An image model through the front door: its raw data lies in class folders (`shapes/<class>/<file>`), so
its scope takes blobs one folder level below the prefix (depth 2), names each pinned file by its path below
the prefix (`circle/a.png`), and pins a folder with the layout the image task reads. A tabular model still
takes only the files directly under its prefix; a user's task says `[trigger] depth` for class folders."""

from __future__ import annotations

import stat
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers.function_app import corpus
from helpers.function_app.served_models import IMAGE, TABULAR, served_environ, write_model

from components.data_version import DataError, DataManifest, check_pinned
from components.errors import ConfigError
from components.model_config import load_model_config
from function_app.events.parsing import parse_blob_created
from function_app.events.triggers import REJECTED, Rejection, TriggerRequest
from function_app.local.watch import FolderSource, Watcher
from function_app.pinning import DownloadedFolder, LandingFolderCopy, PinError, batch_manifest
from function_app.policy.state import PendingBlob
from function_app.settings.app import AppSettings
from function_app.settings.storage import SettingsError
from function_app.wiring import build_front_door

NOW = datetime(2026, 11, 30, 9, 15, tzinfo=UTC)
CUSTOM = 'ref = "mytasks.shapes:ShapesTask"'  # a user's task: its form is all a configuration checks


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    """shapes: the image task's data under shapes/; digits: tabular batches under digits/."""
    write_model(tmp_path / "models", "shapes", IMAGE, 'prefix = "shapes"')
    write_model(tmp_path / "models", "digits", TABULAR, 'prefix = "digits"')
    return served_environ(tmp_path, "shapes,digits")


def _event(name: str, etag: str) -> dict:
    return corpus.blob_created(name=name, eTag=etag, contentType="image/png", envelope={"id": f"ev-{etag}"})


def _manifest(record) -> DataManifest:
    return DataManifest.from_json(record.details["manifest"])


def test_two_classes_files_of_one_name_give_one_submission_with_both(environ):
    front = build_front_door(AppSettings.from_environ(environ), environ, clock=lambda: NOW)

    decisions = [
        front.deliver(_event("shapes/circle/a.png", "0x8D0000000000001"), "blob").decision,
        front.deliver(_event("shapes/square/a.png", "0x8D0000000000002"), "blob").decision,
    ]
    [record] = front.flush(ignore_quiet=True)

    assert REJECTED not in decisions
    assert record.model_name == "shapes"
    files = {file.name: file for file in _manifest(record).files}
    assert sorted(files) == ["circle/a.png", "square/a.png"]
    assert files["square/a.png"].fingerprint == "etag:0x8D0000000000002"
    assert files["circle/a.png"].source == corpus.blob_url("shapes/circle/a.png")


def test_the_next_batch_keeps_the_class_layout_of_the_last(environ):
    front = build_front_door(AppSettings.from_environ(environ), environ, clock=lambda: NOW)
    front.deliver(_event("shapes/circle/a.png", "0x8D0000000000001"), "blob")
    front.flush(ignore_quiet=True)

    front.deliver(_event("shapes/circle/a.png", "0x8D0000000000003"), "blob")  # a new version
    front.deliver(_event("shapes/triangle/b.png", "0x8D0000000000004"), "blob")
    [record] = front.flush(ignore_quiet=True)

    files = {file.name: file.fingerprint for file in _manifest(record).files}
    assert files == {"circle/a.png": "etag:0x8D0000000000003", "triangle/b.png": "etag:0x8D0000000000004"}


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("shapes/circle/small/a.png", "lies 2 folder levels below the prefix 'shapes/' of model 'shapes'"),
        ("shapes/.cache/a.png", "in the hidden folder '.cache' below the prefix 'shapes/' of model 'shapes'"),
        ("digits/2026/batch-1.csv", "in a sub-folder of the prefix 'digits/' of model 'digits'"),
        ("shapes/circle/a.csv", "none of the suffixes .png, .jpg, .jpeg for model 'shapes'"),
    ],
)
def test_a_blob_out_of_its_models_place_is_rejected_saying_why(environ, name, reason):
    result = parse_blob_created(_event(name, "0x8D0000000000005"), AppSettings.from_environ(environ), NOW)

    assert isinstance(result, Rejection)
    assert reason in result.reason


def test_the_single_model_settings_scope_is_tabular_and_refuses_sub_folders(tmp_path, app_settings):
    settings = AppSettings.from_environ(app_settings(tmp_path))

    nested = parse_blob_created(_event(f"{corpus.PREFIX}/2026/batch-1.csv", "0x1"), settings, NOW)
    direct = parse_blob_created(_event(f"{corpus.PREFIX}/batch-1.csv", "0x2"), settings, NOW)

    assert isinstance(nested, Rejection) and "in a sub-folder of the prefix 'digits/'" in nested.reason
    assert isinstance(direct, TriggerRequest)


def test_a_user_task_takes_class_folders_only_when_its_trigger_says_depth(tmp_path):
    write_model(tmp_path / "models", "flat", CUSTOM, 'prefix = "flat"\nsuffixes = [".png"]')
    write_model(tmp_path / "models", "classes", CUSTOM, 'prefix = "classes"\nsuffixes = [".png"]\ndepth = 2')
    settings = AppSettings.from_environ(served_environ(tmp_path, "flat,classes"))

    flat = parse_blob_created(_event("flat/circle/a.png", "0x1"), settings, NOW)
    classes = parse_blob_created(_event("classes/circle/a.png", "0x2"), settings, NOW)

    assert isinstance(flat, Rejection) and "in a sub-folder of the prefix 'flat/'" in flat.reason
    assert isinstance(classes, TriggerRequest) and classes.model_name == "classes"


@pytest.mark.parametrize("value", ["0", "9", "true", "1.5", '"2"'])
def test_a_trigger_depth_out_of_range_is_refused_naming_the_key(tmp_path, value):
    path = write_model(tmp_path / "models", "shapes", IMAGE, f"depth = {value}")

    with pytest.raises(
        ConfigError, match=r"shapes\.toml: \[trigger\] depth is .*; expected a whole number from 1"
    ):
        load_model_config(path)


def test_an_image_scope_has_depth_two_and_a_scope_outside_one_to_eight_is_refused(environ):
    settings = AppSettings.from_environ(environ)
    shapes, digits = settings.model("shapes").scope, settings.model("digits").scope

    assert (shapes.depth, digits.depth) == (2, 1)
    assert shapes.pattern.endswith("/landing/shapes/*/*{.png,.jpg,.jpeg}")
    for depth in (0, 9):
        with pytest.raises(SettingsError, match=f"depth {depth}: expected a whole number from 1"):
            replace(shapes, depth=depth)


# -- a local landing folder: announced, pinned ------------------------------------------------------------


def _landing(tmp_path: Path) -> Path:
    """A landing folder in the image task's layout, with what is not data beside it."""
    folder = tmp_path / "landing"
    for name, content in {
        "circle/a.png": b"circle a",
        "square/a.png": b"square a",
        "loose.png": b"no class",  # directly under the prefix: in place at depth 2 too
        "circle/.a.png.swp": b"editor state",  # hidden: not landing data
        ".cache/b.png": b"hidden folder",
        "circle/small/c.png": b"too deep",  # not announced: deeper than the scope
    }.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return folder


def test_a_watched_folder_announces_class_folder_files_and_the_pin_keeps_the_layout(environ, tmp_path):
    settings = AppSettings.from_environ(environ)
    scope = settings.model("shapes").scope
    front = build_front_door(settings, environ, clock=lambda: NOW)
    landing = _landing(tmp_path)
    delivered = []
    watcher = Watcher(
        FolderSource(landing, scope),
        scope,
        tmp_path / "state",
        lambda event: delivered.append(front.deliver(event, "blob").decision),
        lambda: NOW,
    )

    events = watcher.poll()
    [record] = front.flush(ignore_quiet=True)
    manifest = _manifest(record)
    ref = LandingFolderCopy(landing, tmp_path / "home", f"{scope.container_url}/shapes", depth=2).pin(
        manifest, "shapes"
    )

    names = sorted(event["subject"].rsplit("/blobs/", 1)[1] for event in events)
    assert names == ["shapes/circle/a.png", "shapes/loose.png", "shapes/square/a.png"]
    assert REJECTED not in delivered
    assert [file.name for file in manifest.files] == ["circle/a.png", "loose.png", "square/a.png"]
    pinned = Path(ref.uri)
    assert sorted(path.relative_to(pinned).as_posix() for path in pinned.rglob("*") if path.is_file()) == [
        "circle/a.png",
        "loose.png",
        "square/a.png",
    ]
    assert (pinned / "square" / "a.png").read_bytes() == b"square a"


def test_a_landing_folder_lists_its_class_folders_for_a_data_request(environ, tmp_path):
    scope = AppSettings.from_environ(environ).model("shapes").scope
    folder_url = f"{scope.container_url}/shapes"
    pinner = LandingFolderCopy(_landing(tmp_path), tmp_path / "home", folder_url, depth=2)

    manifest = pinner.folder_manifest(f"{folder_url}/", scope.suffixes, "shapes")

    assert [file.name for file in manifest.files] == ["circle/a.png", "loose.png", "square/a.png"]
    assert manifest.files[0].source == f"{folder_url}/circle/a.png"


def test_a_batch_blob_outside_the_models_scope_fails_the_pin_instead_of_naming_it_wrongly(environ):
    scope = AppSettings.from_environ(environ).model("shapes").scope
    stray = PendingBlob(corpus.blob_url("shapes/circle/small/a.png"), "0x1", "01", 3)
    other = PendingBlob(corpus.blob_url("digits/batch-1.csv"), "0x2", "02", 3)

    with pytest.raises(PinError, match="deeper than 2 level"):
        batch_manifest([stray], None, scope)
    with pytest.raises(PinError, match="not under the model's prefix"):
        batch_manifest([other], None, scope)


# -- a landing container (Azurite): listed, downloaded ----------------------------------------------------


def test_a_landing_container_lists_class_folders_and_downloads_them_in_the_class_layout(
    blob_container, tmp_path
):
    for name, content in {
        "shapes/circle/a.png": b"circle a",
        "shapes/square/a.png": b"square a",
        "shapes/circle/small/c.png": b"too deep",
        "shapes/.cache/b.png": b"hidden folder",
        "shapes/square/notes.txt": b"not an image",
    }.items():
        blob_container.upload_blob(name, content)
    pinner = DownloadedFolder(blob_container, tmp_path / "home", depth=2)

    manifest = pinner.folder_manifest(f"{blob_container.url}/shapes/", (".png",), "shapes")
    pinned = Path(pinner.pin(manifest, "shapes").uri)

    assert [file.name for file in manifest.files] == ["circle/a.png", "square/a.png"]
    assert sorted(path.relative_to(pinned).as_posix() for path in pinned.rglob("*") if path.is_file()) == [
        "circle/a.png",
        "square/a.png",
    ]
    assert (pinned / "circle" / "a.png").read_bytes() == b"circle a"
    assert stat.S_IMODE((pinned / "circle" / "a.png").stat().st_mode) == 0o444  # published read-only
    (pinned / "circle" / "a.png").chmod(0o644)
    (pinned / "circle" / "a.png").write_bytes(b"circle a, and a row a task appended")
    assert Path(pinner.pin(manifest, "shapes").uri) == pinned  # a damaged copy is downloaded again
    assert (pinned / "circle" / "a.png").read_bytes() == b"circle a"
    # An edit that keeps the size is seen too: the copy's own sha256 was taken as it was written.
    (pinned / "circle" / "a.png").chmod(0o644)
    (pinned / "circle" / "a.png").write_bytes(b"CIRCLE A")
    with pytest.raises(
        DataError, match=r"circle/a\.png changed since it was pinned \(sha256 .* in its manifest"
    ):
        check_pinned(pinned)
    assert Path(pinner.pin(manifest, "shapes").uri) == pinned
    assert (pinned / "circle" / "a.png").read_bytes() == b"circle a"
    check_pinned(pinned)
