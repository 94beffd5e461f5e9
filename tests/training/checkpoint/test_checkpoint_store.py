"""The checkpoint store contract, run against both stores, plus what is specific to each.

Every test that takes `make_store` or `store` runs once on a local folder and once on Azurite, so the two
stores are held to exactly the same behaviour.
"""

from __future__ import annotations

import base64
import errno
import os
import random
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest
from azure.storage.blob import ContainerClient

from core.errors import CheckpointError
from core.secrets import mask_secrets
from training.checkpoint.blob_store import BlobCheckpointStore, open_blob_store
from training.checkpoint.free_space import check_room
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.open_store import CONNECTION_STRING_VARIABLE, open_checkpoint_store
from training.checkpoint.store_protocol import (
    CheckpointStore,
    ObjectExistsError,
    ObjectNotFoundError,
    storage_failure,
)

if TYPE_CHECKING:
    from helpers.azurite import Azurite

REPO_ROOT = Path(__file__).resolve().parents[3]

MiB = 1024 * 1024
# Small limits so that a few MiB already take the paths big checkpoints take: the spool spills to disk and
# the upload stages several blocks concurrently before committing the block list.
SPOOL_LIMIT_BYTES = 1 * MiB
SMALL_BLOCKS = {"max_single_put_size": 1 * MiB, "max_block_size": 1 * MiB}
INVALID_NAMES = ["../x", "a/b", ".hidden", "", "x" * 201, "a\\b", "with space", "x\n"]

StoreFactory = Callable[[str], CheckpointStore]


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def write(store: CheckpointStore, name: str, data: bytes) -> None:
    with store.writer(name) as file:
        file.write(data)


class Boom(Exception):
    """Raised inside a writer block to stand for any failure while serialising."""


@pytest.fixture
def small_block_container(azurite: Azurite) -> Iterator[ContainerClient]:
    container = azurite.new_container(**SMALL_BLOCKS)
    yield container
    container.delete_container()


@pytest.fixture(params=["local", "blob"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Opens a store on a folder (local) or a prefix (blob) of the given name; same name, same objects."""
    if request.param == "local":
        return lambda folder: LocalCheckpointStore(tmp_path / folder)
    # Looked up only for the blob variant, so `-k local` runs without starting Azurite.
    container: ContainerClient = request.getfixturevalue("small_block_container")
    return lambda folder: BlobCheckpointStore(
        container, f"runs/{folder}", spool_limit_bytes=SPOOL_LIMIT_BYTES
    )


@pytest.fixture
def store(make_store: StoreFactory) -> CheckpointStore:
    return make_store("run")


# --- the contract, for both stores -------------------------------------------------------------------


def test_is_a_checkpoint_store(store: CheckpointStore) -> None:
    assert isinstance(store, CheckpointStore)


@pytest.mark.parametrize("size", [0, 1, 3 * MiB + 17], ids=["empty", "one-byte", "multi-MiB"])
def test_bytes_round_trip(store: CheckpointStore, size: int) -> None:
    data = payload(size)
    with store.writer("ckpt-000100.pt") as file:
        for start in range(0, size, 256 * 1024):  # many writes, as a serialiser would do
            file.write(data[start : start + 256 * 1024])
    assert store.read("ckpt-000100.pt") == data
    assert store.names() == ["ckpt-000100.pt"]


def test_names_are_sorted_and_complete(store: CheckpointStore) -> None:
    assert store.names() == []
    written = ["step-10.pt", "a.json", "step-2.pt", "Z_last", "step-10.pt.sha256"]
    for index, name in enumerate(written):
        write(store, name, payload(10, seed=index))
    assert store.names() == sorted(written)


def test_read_of_a_missing_name_raises_not_found(store: CheckpointStore) -> None:
    write(store, "present", b"x")
    with pytest.raises(ObjectNotFoundError, match="'absent'"):
        store.read("absent")


def test_existing_name_is_refused_and_keeps_its_bytes(store: CheckpointStore) -> None:
    write(store, "ckpt", b"original")
    with pytest.raises(ObjectExistsError, match="'ckpt'"), store.writer("ckpt") as file:
        file.write(b"replacement")
    assert store.read("ckpt") == b"original"
    assert store.names() == ["ckpt"]
    assert store.discard_incomplete() == 0  # the refused write cleaned up after itself


def test_name_taken_while_writing_is_refused_on_exit(store: CheckpointStore) -> None:
    with pytest.raises(ObjectExistsError), store.writer("ckpt") as slow:
        slow.write(payload(3 * MiB))
        write(store, "ckpt", b"the faster writer")
    assert store.read("ckpt") == b"the faster writer"
    assert store.names() == ["ckpt"]
    assert store.discard_incomplete() == 0


@pytest.mark.parametrize("size", [10, 3 * MiB], ids=["small", "multi-MiB"])
def test_exception_inside_writer_leaves_nothing_visible(store: CheckpointStore, size: int) -> None:
    with pytest.raises(Boom), store.writer("ckpt") as file:
        file.write(payload(size))
        raise Boom
    assert store.names() == []
    with pytest.raises(ObjectNotFoundError):
        store.read("ckpt")
    assert store.discard_incomplete() == 0
    write(store, "ckpt", b"second attempt")  # the failed write did not reserve the name
    assert store.read("ckpt") == b"second attempt"


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_names_are_rejected(store: CheckpointStore, name: str) -> None:
    with pytest.raises(CheckpointError, match="not allowed"), store.writer(name) as file:
        file.write(b"x")
    with pytest.raises(CheckpointError, match="not allowed"):
        store.read(name)
    with pytest.raises(CheckpointError, match="not allowed"):
        store.delete(name)
    assert store.names() == []


def test_delete_is_idempotent(store: CheckpointStore) -> None:
    write(store, "old", b"old bytes")
    write(store, "kept", b"kept bytes")
    store.delete("old")
    store.delete("old")
    store.delete("never-written")
    assert store.names() == ["kept"]
    with pytest.raises(ObjectNotFoundError):
        store.read("old")
    write(store, "old", b"new bytes")  # a deleted name can be written again
    assert store.read("old") == b"new bytes"


def test_stores_on_different_folders_are_isolated(make_store: StoreFactory) -> None:
    # "run" is a string prefix of "run-2": a listing by plain string prefix would leak between them.
    first, second = make_store("run"), make_store("run-2")
    write(first, "ckpt", b"first")
    write(second, "ckpt", b"second")
    write(second, "only-in-second", b"2")
    assert first.names() == ["ckpt"]
    assert second.names() == ["ckpt", "only-in-second"]
    first.delete("ckpt")
    assert second.read("ckpt") == b"second"
    assert make_store("run").names() == []  # a second store on the same folder sees the same objects


def test_free_space_is_the_file_systems_or_unknown_on_blob(store: CheckpointStore, tmp_path: Path) -> None:
    free = store.free_bytes()
    if isinstance(store, LocalCheckpointStore):
        assert isinstance(free, int) and 0 < free <= shutil.disk_usage(tmp_path).total
    else:
        assert free is None  # a storage account has no quota a client can read


def test_the_check_before_training_writes_and_deletes_a_probe(store: CheckpointStore) -> None:
    write(store, "retrain-probe-0123456789abcdef", b"x")  # the probe of a run killed between write and delete
    write(store, "kept", b"kept")
    check_room(store, checkpoint_bytes=1, basis="one byte", keep_last=2)
    assert store.names() == ["kept"]
    assert store.discard_incomplete() == 0


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on device on LOC"),
        (OSError(errno.EROFS, "Read-only file system"), "read-only file system on LOC"),
        (CheckpointError("cannot write checkpoint objects in X: Permission denied"), "cannot write "
         "checkpoint objects in X: Permission denied"),
        (RuntimeError("bad\nsecond line"), "bad"),
    ],
)  # fmt: skip
def test_a_storage_failure_is_one_line_with_the_operating_systems_reason(error, expected) -> None:
    assert storage_failure(error, "LOC") == expected


def test_a_storage_failure_behind_torchs_enforce_message_gives_the_os_reason_masked() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
            ) from None
    except RuntimeError as error:
        torch_error = error
    location = "https://acct.blob.core.windows.net/c/run?sig=SECRET"
    assert storage_failure(torch_error, location) == "no space left on device on " + mask_secrets(location)
    assert "SECRET" not in storage_failure(torch_error, location)


# --- local folder ------------------------------------------------------------------------------------

CRASH_INSIDE_WRITER = """
import os, sys
from pathlib import Path
from urllib.parse import quote
from training.checkpoint.local_store import LocalCheckpointStore

with LocalCheckpointStore(Path(sys.argv[1])).writer("ckpt") as file:
    file.write(b"half a checkpoint")
    file.flush()
    os._exit(3)
"""


def test_local_write_killed_midway_is_invisible_and_discarded(tmp_path: Path) -> None:
    crashed = subprocess.run(
        [sys.executable, "-c", CRASH_INSIDE_WRITER, str(tmp_path)], cwd=REPO_ROOT, capture_output=True
    )
    assert crashed.returncode == 3, crashed.stderr.decode()
    assert len(os.listdir(tmp_path)) == 1  # the crash really left a temp file behind
    store = LocalCheckpointStore(tmp_path)
    assert store.names() == []
    with pytest.raises(ObjectNotFoundError):
        store.read("ckpt")
    assert store.discard_incomplete() == 1
    assert os.listdir(tmp_path) == []
    assert store.discard_incomplete() == 0


def test_local_names_lists_only_objects_directly_in_the_folder(tmp_path: Path) -> None:
    store = LocalCheckpointStore(tmp_path / "store")
    write(store, "ckpt", b"x")
    (store.root / "nested").mkdir()
    (store.root / "nested" / "inner").write_bytes(b"y")
    (store.root / "not an object name").write_bytes(b"z")
    assert store.names() == ["ckpt"]
    assert store.discard_incomplete() == 0  # foreign files are not mistaken for crashed writes


# --- blob container ----------------------------------------------------------------------------------


# Block ids as azure-storage-blob's own uploads make them: 12.28 and later, and 12.27 and earlier. Blocks
# left by a killed upload may come from either, whichever version writes next.
LEFTOVER_BLOCK_IDS = {
    "sdk-12.28+": lambda: f"{uuid.uuid4().int:048d}",
    "sdk-12.27": lambda: base64.b64encode(quote(base64.b64encode(b"%032d" % 0)).encode()).decode(),
}


@pytest.mark.parametrize("leftover_id", LEFTOVER_BLOCK_IDS.values(), ids=LEFTOVER_BLOCK_IDS.keys())
@pytest.mark.parametrize("size", [10, 3 * MiB], ids=["single-put", "staged-blocks"])
def test_blob_uncommitted_blocks_are_invisible_and_do_not_block_a_write(
    small_block_container: ContainerClient, size: int, leftover_id
) -> None:
    store = BlobCheckpointStore(small_block_container, "runs/r1")
    # What an upload killed between staging its blocks and committing the block list leaves behind.
    leftover = small_block_container.get_blob_client("runs/r1/ckpt")
    leftover.stage_block(leftover_id(), b"half a checkpoint")
    assert store.names() == []
    with pytest.raises(ObjectNotFoundError):
        store.read("ckpt")
    assert store.discard_incomplete() == 0
    complete = payload(size)
    write(store, "ckpt", complete)
    assert store.read("ckpt") == complete
    assert store.names() == ["ckpt"]


def test_blob_names_lists_only_direct_children_with_object_names(blob_container: ContainerClient) -> None:
    store = BlobCheckpointStore(blob_container, "runs/r1/")
    write(store, "ckpt", b"x")
    for foreign in ["runs/r1/nested/inner", "runs/r1/.hidden", "runs/r1x", "runs/other"]:
        blob_container.upload_blob(foreign, b"y")
    assert store.names() == ["ckpt"]
    assert blob_container.download_blob("runs/r1/ckpt").readall() == b"x"


def test_blob_store_at_the_container_root(blob_container: ContainerClient) -> None:
    store = BlobCheckpointStore(blob_container)
    write(store, "ckpt", b"x")
    blob_container.upload_blob("folder/inner", b"y")
    assert store.names() == ["ckpt"]
    assert store.location == blob_container.url


@pytest.mark.parametrize("prefix", ["/runs", "runs/../other", "runs//r1", "..", "runs/.hidden"])
def test_blob_prefix_must_be_a_plain_folder_path(blob_container: ContainerClient, prefix: str) -> None:
    with pytest.raises(CheckpointError, match="prefix"):
        BlobCheckpointStore(blob_container, prefix)


def test_blob_missing_container_is_reported_as_such(azurite: Azurite) -> None:
    container = azurite.service_client().get_container_client("never-created")
    store = BlobCheckpointStore(container, "runs/r1")
    for operation in (store.names, lambda: store.read("ckpt"), lambda: write(store, "ckpt", b"x")):
        with pytest.raises(CheckpointError, match="does not exist") as raised:
            operation()
        assert not isinstance(raised.value, ObjectNotFoundError)


def test_blob_wrong_key_fails_with_a_masked_one_line_error(
    azurite: Azurite, blob_container: ContainerClient
) -> None:
    wrong_key = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXk="
    connection_string = azurite.connection_string.replace(azurite.account_key, wrong_key)
    store = open_blob_store(azurite.container_url(blob_container.container_name), connection_string)
    with pytest.raises(CheckpointError, match="403") as raised:
        store.names()
    message = str(raised.value)
    assert "\n" not in message
    assert wrong_key not in message and azurite.account_key not in message


# --- opening a blob store from a URL -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "container", "prefix"),
    [
        ("https://myacct.blob.core.windows.net/ckpts/runs/run-1", "ckpts", "runs/run-1"),
        ("https://myacct.blob.core.windows.net/ckpts/runs/run-1/", "ckpts", "runs/run-1"),
        ("https://myacct.blob.core.windows.net/ckpts", "ckpts", ""),
    ],
)
def test_cloud_url_opens_a_store_with_managed_identity(url: str, container: str, prefix: str) -> None:
    store = open_blob_store(url)  # no request is sent until the store is used
    assert isinstance(store, CheckpointStore)
    assert (store.container_name, store.prefix) == (container, prefix)
    assert store.location == url.rstrip("/")


def test_emulator_url_with_connection_string_reads_and_writes(
    azurite: Azurite, blob_container: ContainerClient
) -> None:
    url = f"{azurite.container_url(blob_container.container_name)}/runs/r1"
    store = open_blob_store(url, azurite.connection_string)
    write(store, "ckpt", b"via url")
    assert blob_container.download_blob("runs/r1/ckpt").readall() == b"via url"
    assert store.location == url
    assert azurite.account_key not in store.location


def test_emulator_url_without_connection_string_is_refused(azurite: Azurite) -> None:
    with pytest.raises(CheckpointError, match="connection string"):
        open_blob_store(f"{azurite.blob_endpoint}/ckpts/runs")


@pytest.mark.parametrize(
    "other",
    [
        "DefaultEndpointsProtocol=http;AccountName=otheracct;AccountKey={key};"
        "BlobEndpoint=http://127.0.0.1:1/otheracct;",
        "DefaultEndpointsProtocol=https;AccountName=otheracct;AccountKey={key};EndpointSuffix=core.windows.net",
    ],
    ids=["other-emulator-account", "cloud-account"],
)
def test_connection_string_for_another_account_is_refused(azurite: Azurite, other: str) -> None:
    key = azurite.account_key
    with pytest.raises(CheckpointError, match="otheracct") as raised:
        open_blob_store(f"{azurite.blob_endpoint}/ckpts/runs", other.format(key=key))
    message = str(raised.value)
    assert azurite.account in message and "\n" not in message and key not in message


def test_connection_string_for_another_endpoint_of_the_same_account_is_refused(azurite: Azurite) -> None:
    moved = azurite.connection_string.replace(azurite.blob_endpoint, f"http://127.0.0.1:1/{azurite.account}")
    with pytest.raises(CheckpointError, match=r"127\.0\.0\.1:1/"):
        open_blob_store(f"{azurite.blob_endpoint}/ckpts/runs", moved)


def test_malformed_connection_string_is_refused_without_echoing_it() -> None:
    with pytest.raises(CheckpointError, match="malformed") as raised:
        open_blob_store("https://myacct.blob.core.windows.net/ckpts", "nonsense;AccountKey=SECRETKEY")
    assert "SECRETKEY" not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("ftp://myacct.blob.core.windows.net/ckpts/p", "ftp://myacct.blob.core.windows.net/ckpts/p"),
        ("http://myacct.blob.core.windows.net/ckpts/p", "http://myacct.blob.core.windows.net/ckpts/p"),
        ("https://example.com/ckpts/p", "https://example.com/ckpts/p"),
        ("https://myacct.blob.core.windows.net", "https://myacct.blob.core.windows.net"),
        ("https://myacct.blob.core.windows.net/Bad_Container/p", "Bad_Container"),
        ("https://myacct.blob.core.windows.net/ckpts/runs/../p", "ckpts/runs/../p"),
        ("https://myacct.blob.core.windows.net/ckpts/runs//p", "ckpts/runs//p"),
        ("http://127.0.0.1:10000/UPPER/ckpts/p", "UPPER"),
        ("https://myacct.blob.core.windows.net/ckpts/p?sv=2024-01-01&sig=SECRETSIG", "ckpts/p'"),
        ("https://user:SECRETSIG@myacct.blob.core.windows.net/ckpts/p", "https://myacct.blob"),
        ("not a url", "not a url"),
    ],
)
def test_bad_url_is_refused_with_one_masked_line(url: str, shown: str) -> None:
    with pytest.raises(CheckpointError) as raised:
        open_blob_store(url)
    message = str(raised.value)
    assert shown in message
    assert "expected https://<account>.blob.core.windows.net/<container>/<prefix>" in message
    assert "\n" not in message and "SECRETSIG" not in message


def test_mask_secrets_hides_keys_and_signatures() -> None:
    text = (
        "AccountName=acct;AccountKey=abc+/KEY==;BlobEndpoint=https://acct.blob.core.windows.net/; "
        "SharedAccessSignature=sv=2024&sig=SIG1; url https://acct.blob.core.windows.net/c?sv=1&sig=SIG2%3D&se=2"
    )
    masked = mask_secrets(text)
    for secret in ("abc+/KEY==", "SIG1", "SIG2"):
        assert secret not in masked
    assert "AccountName=acct;AccountKey=***;" in masked
    assert "?sv=1&sig=***&se=2" in masked
    assert mask_secrets("nothing secret; design=1") == "nothing secret; design=1"


# --- opening a store from a spec ---------------------------------------------------------------------


def test_spec_of_a_folder_opens_a_local_store_creating_the_folder(tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet"
    store = open_checkpoint_store(str(root), {})
    assert isinstance(store, LocalCheckpointStore)
    assert store.location == str(root)
    write(store, "ckpt", b"x")
    assert (root / "ckpt").read_bytes() == b"x"


def test_spec_of_a_url_opens_a_blob_store_with_the_environment_connection_string(
    azurite: Azurite, blob_container: ContainerClient
) -> None:
    url = f"{azurite.container_url(blob_container.container_name)}/runs/r1"
    store = open_checkpoint_store(url, {CONNECTION_STRING_VARIABLE: azurite.connection_string})
    assert isinstance(store, BlobCheckpointStore)
    write(store, "ckpt", b"x")
    assert blob_container.download_blob("runs/r1/ckpt").readall() == b"x"


@pytest.mark.parametrize("spec", ["", "   ", "s3://bucket/ckpts", "azureml://datastores/ckpts/paths/x"])
def test_unsupported_spec_is_refused(spec: str) -> None:
    with pytest.raises(CheckpointError, match="expected a local folder path"):
        open_checkpoint_store(spec, {})


def test_local_spec_does_not_import_the_azure_sdk(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from training.checkpoint.open_store import open_checkpoint_store\n"
        "store = open_checkpoint_store(sys.argv[1], {})\n"
        "print(type(store).__name__, sorted(m for m in sys.modules if m.startswith('azure')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 1) == ["LocalCheckpointStore", "[]\n"]
