"""A pinned version stores only what is new: both local pinners (a landing folder's copy, Azurite's download)
keep each file's bytes once, and fetch a file again only when no earlier version had it."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.data_version import DataFile, DataManifest, check_pinned
from core.objects import bytes_stored
from function_app.pinning import DownloadedFolder, LandingFolderCopy, content_etag

ROWS = 2_000


def batch(number: int) -> bytes:
    lines = [f"r{number}-{row},{row % 10},{row % 17}" for row in range(ROWS)]
    return ("row_key,label,pixel_0\n" + "\n".join(lines) + "\n").encode()


class Landing:
    """A landing folder and its pinner."""

    def __init__(self, tmp_path: Path) -> None:
        self.folder = tmp_path / "landing"
        self.folder.mkdir()
        self.url = "http://127.0.0.1:10000/devstoreaccount1/landing/digits"
        self.pinner = LandingFolderCopy(self.folder, tmp_path / "home", self.url)
        self.files: dict[str, DataFile] = {}

    def upload(self, name: str, data: bytes) -> None:
        path = self.folder / name
        path.write_bytes(data)
        self.files[name] = DataFile(name, len(data), f"etag:{content_etag(path)}", f"{self.url}/{name}")

    def remove(self, name: str) -> None:
        (self.folder / name).unlink()

    def file(self, name: str) -> DataFile:
        return self.files[name]


class Container:
    """An Azurite container and the pinner that downloads from it."""

    def __init__(self, container, tmp_path: Path) -> None:
        self.container = container
        self.pinner = DownloadedFolder(container, tmp_path / "home")
        self.files: dict[str, DataFile] = {}

    def upload(self, name: str, data: bytes) -> None:
        blob = self.container.upload_blob(f"digits/{name}", data)
        etag = str(blob.get_blob_properties().etag).strip('"')
        self.files[name] = DataFile(name, len(data), f"etag:{etag}", f"{self.container.url}/digits/{name}")

    def remove(self, name: str) -> None:
        self.container.delete_blob(f"digits/{name}")

    def file(self, name: str) -> DataFile:
        return self.files[name]


@pytest.fixture(params=["landing folder", "azurite"])
def source(request, tmp_path: Path):
    if request.param == "landing folder":
        return Landing(tmp_path)
    return Container(request.getfixturevalue("blob_container"), tmp_path)


def test_a_new_version_stores_and_fetches_only_its_new_files(source, tmp_path: Path):
    for number in (1, 2, 3):
        source.upload(f"batch-{number}.csv", batch(number))
    first = DataManifest(tuple(source.file(f"batch-{n}.csv") for n in (1, 2, 3)))
    first_folder = Path(source.pinner.pin(first, "digits").uri)
    stored_first = bytes_stored(tmp_path / "home" / "data")

    source.upload("batch-4.csv", batch(4))
    # Gone from the source now: the second version must not need to fetch what the first one pinned.
    source.remove("batch-1.csv")
    second = DataManifest(tuple(source.file(f"batch-{n}.csv") for n in (1, 2, 3, 4)))
    second_folder = Path(source.pinner.pin(second, "digits").uri)

    grown = bytes_stored(tmp_path / "home" / "data") - stored_first
    new_bytes = len(batch(4))
    assert new_bytes <= grown <= new_bytes + 4096  # the new file, and the second version's manifest files
    assert (second_folder / "batch-1.csv").read_bytes() == batch(1)
    assert (second_folder / "batch-1.csv").stat().st_ino == (first_folder / "batch-1.csv").stat().st_ino
    check_pinned(first_folder)
    check_pinned(second_folder)


def test_a_damaged_shared_file_is_refetched_for_the_version_that_finds_it(source, tmp_path: Path):
    source.upload("batch-1.csv", batch(1))
    source.upload("batch-2.csv", batch(2))
    first = DataManifest((source.file("batch-1.csv"),))
    second = DataManifest((source.file("batch-1.csv"), source.file("batch-2.csv")))
    first_folder = Path(source.pinner.pin(first, "digits").uri)
    second_folder = Path(source.pinner.pin(second, "digits").uri)
    shared = second_folder / "batch-1.csv"
    shared.chmod(0o644)
    shared.write_bytes(batch(1).replace(b"r1-0,0,0", b"r1-0,9,9"))  # in place: both versions see it

    assert Path(source.pinner.pin(second, "digits").uri) == second_folder

    check_pinned(second_folder)
    assert (second_folder / "batch-1.csv").read_bytes() == batch(1)
    # The first version still holds the damaged inode, and its own check says so before anyone reads it.
    with pytest.raises(Exception, match=r"batch-1\.csv changed since it was pinned"):
        check_pinned(first_folder)
    assert Path(source.pinner.pin(first, "digits").uri) == first_folder
    check_pinned(first_folder)
