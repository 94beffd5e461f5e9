"""Shared fixtures: Azurite, the Azure Storage emulator, for every test that talks to Blob Storage.

`azurite` (session) starts one emulator with a random account and key; `blob_container` (function) gives a
test its own freshly created container and deletes it afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from helpers.azurite import Azurite, running_azurite

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

# The files whose tests take longest, longest first. `make test` spreads whole files over two workers
# (--dist loadfile), handing the next file to whichever is free; starting with the long ones keeps one worker
# from ending the suite alone on a long file while the other is idle. Only the order changes.
SLOWEST_FILES = (
    "tests/test_demo.py",
    "tests/components/local/test_concurrent_runs.py",
    "tests/components/test_readme_task.py",
    "tests/training/engine/test_resume.py",
    "tests/training/engine/test_optimization_resume.py",
    "tests/components/local/test_local_pipeline.py",
    "tests/training/engine/test_orphan_workers.py",
    "tests/training/checkpoint/test_checkpoint_integrity.py",
    "tests/training/tasks/test_image_resume.py",
    "tests/training/engine/test_tracking.py",
    "tests/training/checkpoint/test_checkpoint_lease.py",
    "tests/training/engine/test_nonfinite_loss.py",
    "tests/function_app/test_storm.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: index for index, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(SLOWEST_FILES)))


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One Azurite for the whole session, with an account name and key generated for this session only."""
    with running_azurite(tmp_path_factory.mktemp("azurite")) as emulator:
        yield emulator


@pytest.fixture
def blob_container(azurite: Azurite) -> Iterator[ContainerClient]:
    """A new, empty container for one test; deleted afterwards."""
    container = azurite.new_container()
    yield container
    container.delete_container()
