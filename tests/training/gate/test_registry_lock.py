"""The registry lock: one holder at a time, across processes (flock) and machines (a lease on Azurite)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import CheckpointError, InputError
from training.gate.lock import BlobLeaseLock, FileLock, LockTimeoutError, open_registry_lock

HOLD_UNTIL_STDIN_CLOSES = """
import sys
from pathlib import Path
from training.gate.lock import FileLock
with FileLock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def hold_in_another_process(path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_UNTIL_STDIN_CLOSES, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_a_second_file_lock_waits_for_the_first_and_gets_it_once_released(tmp_path: Path):
    path = tmp_path / "locks" / "digits.lock"
    with FileLock(path):
        with pytest.raises(
            LockTimeoutError, match=r"still held by another registration after 0.2 s"
        ) as raised:
            FileLock(path, wait_seconds=0.2).__enter__()
        assert str(path) in str(raised.value)
        assert "pid " in path.read_text()  # the holder says who it is
    with FileLock(path, wait_seconds=0.2) as second:
        assert second.location == str(path)


def test_a_file_lock_excludes_another_process_and_is_freed_when_that_process_dies(tmp_path: Path):
    path = tmp_path / "digits.lock"
    holder = hold_in_another_process(path)
    try:
        with pytest.raises(LockTimeoutError):
            FileLock(path, wait_seconds=0.2).__enter__()
        holder.kill()  # no clean release: the kernel drops a dead process's lock
        holder.wait()
        with FileLock(path, wait_seconds=5):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_a_waiting_file_lock_gets_the_lock_as_soon_as_the_holder_releases(tmp_path: Path):
    path = tmp_path / "digits.lock"
    holder = hold_in_another_process(path)
    assert holder.stdin is not None
    holder.stdin.close()  # the holder leaves its `with` block and exits
    with FileLock(path, wait_seconds=30):
        assert holder.wait() == 0


def test_a_folder_spec_opens_a_file_lock_per_model(tmp_path: Path):
    lock = open_registry_lock(str(tmp_path / "locks"), "digits", {})
    assert isinstance(lock, FileLock)
    assert lock.location == str(tmp_path / "locks" / "digits.lock")


@pytest.fixture
def lock_url(azurite, blob_container) -> str:
    return azurite.container_url(blob_container.container_name) + "/registry/locks"


def blob_lock(azurite, url: str, wait_seconds: float = 0.3) -> BlobLeaseLock:
    environ = {"RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string}
    lock = open_registry_lock(url, "digits", environ, wait_seconds=wait_seconds)
    assert isinstance(lock, BlobLeaseLock)
    return lock


def test_a_blob_lease_lock_excludes_a_second_holder_until_released(azurite, blob_container, lock_url):
    blob = blob_container.get_blob_client("registry/locks/digits.lock")
    first = blob_lock(azurite, lock_url)
    with first:
        assert blob.get_blob_properties().lease.state == "leased"
        with pytest.raises(LockTimeoutError, match="still held by another registration") as raised:
            blob_lock(azurite, lock_url).__enter__()
        assert raised.value.args[0].count("digits.lock") == 1
    assert blob.get_blob_properties().lease.state == "available"
    with blob_lock(azurite, lock_url) as second:
        assert second.location == f"{lock_url}/digits.lock"
        assert blob.get_blob_properties().lease.state == "leased"


def test_a_blob_lock_in_a_missing_container_fails_in_one_line(azurite):
    url = azurite.container_url("never-created") + "/locks"
    with pytest.raises(InputError, match="its container does not exist; create it first") as raised:
        blob_lock(azurite, url).__enter__()
    assert "\n" not in str(raised.value)


def test_a_blob_lock_with_the_wrong_key_fails_without_the_key(azurite, lock_url):
    wrong_key = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXk="
    environ = {
        "RETRAIN_STORAGE_CONNECTION_STRING": azurite.connection_string.replace(azurite.account_key, wrong_key)
    }
    lock = open_registry_lock(lock_url, "digits", environ, wait_seconds=0.3)
    with pytest.raises(InputError, match=r"registry lock .*HTTP 403") as raised:
        lock.__enter__()
    assert wrong_key not in str(raised.value) and azurite.account_key not in str(raised.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "https://acct.blob.core.windows.net/locks?sig=secret",
            "registry lock URL .*credentials do not belong",
        ),
        ("http://example.com/acct/locks", "registry lock URL .*neither an Azure Blob Storage account"),
    ],
)
def test_an_unusable_lock_url_is_refused_naming_it_as_the_lock(spec: str, message: str):
    with pytest.raises(CheckpointError, match=message) as raised:
        open_registry_lock(spec, "digits", {})
    assert "secret" not in str(raised.value)


def test_an_empty_lock_spec_is_refused():
    with pytest.raises(InputError, match="--lock ''"):
        open_registry_lock(" ", "digits", {})


def test_a_lease_outside_what_azure_allows_is_refused(azurite, blob_container):
    with pytest.raises(InputError, match="Azure leases last 15 to 60 seconds"):
        BlobLeaseLock(blob_container.get_blob_client("x.lock"), lease_seconds=5)
