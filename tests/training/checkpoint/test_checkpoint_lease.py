"""One writer per run (issue 14, item 2): an attempt holds a lease on its checkpoint location while it trains.

A second attempt waits for it or is refused in one line naming the holder; a holder that dies loses it (the
kernel drops a dead process's flock, a blob lease that is not renewed expires); a lease that is lost stops
its attempt before it writes again. Both twins: a local folder and Blob Storage on Azurite.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobLeaseClient, ContainerClient
from helpers.training.run_outputs import read_metadata
from helpers.training.small_run import NO_TRACKING, TOTAL_STEPS, train_arguments
from helpers.training.training_process import is_checkpoint
from helpers.training.warm_training import WarmStarts

from core.errors import CheckpointError
from core.storage.leases import LeaseRenewal
from training.checkpoint.blob_store import BlobCheckpointStore
from training.checkpoint.lease import (
    LEASE_NAME,
    WAIT_VARIABLE,
    BlobCheckpointLease,
    CheckpointLease,
    LeasedStore,
    LeaseHeldError,
    LeaseLostError,
    LocalCheckpointLease,
)
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.open_store import (
    CONNECTION_STRING_VARIABLE,
    open_checkpoint_lease,
    open_checkpoint_store,
)
from training.checkpoint.records import committed_checkpoints
from training.checkpoint.store_protocol import CheckpointStore
from training.cli import main
from training.engine.supervise import TrainingProcess

PREFIX = "runs/small"
RESULT_TIMEOUT_S = 60.0  # bounds on waiting for another process or thread, never expected to be reached
SHORTEST_BLOB_LEASE_S = 15  # Azure's minimum: a dead holder's lease expires soonest


@dataclass
class Location:
    """A checkpoint location of one twin: its `--checkpoints` spec and the environment that opens it."""

    spec: str
    environ: dict[str, str] = field(default_factory=dict)
    container: ContainerClient | None = None
    secret: str | None = None  # what no message may show

    def lease(self, launch_id: str, wait_seconds: float, **options: Any) -> CheckpointLease:
        """A lease with injected options (a short blob lease, a quicker poll), as the opener would build."""
        if self.container is None:
            return LocalCheckpointLease(Path(self.spec), launch_id, wait_seconds, **options)
        return BlobCheckpointLease(self.container, PREFIX, launch_id, wait_seconds, **options)

    def store(self) -> CheckpointStore:
        return open_checkpoint_store(self.spec, self.environ)


@pytest.fixture(params=["local", "blob"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Location]:
    if request.param == "local":
        yield Location(str(tmp_path / "checkpoints"))
        return
    azurite = request.getfixturevalue("azurite")
    container = azurite.new_container()
    yield Location(
        f"{azurite.container_url(container.container_name)}/{PREFIX}",
        {CONNECTION_STRING_VARIABLE: azurite.connection_string},
        container,
        azurite.account_key,
    )
    container.delete_container()


def assert_names_holder(message: str, location: Location, pid: int, launch_id: str) -> None:
    assert "\n" not in message and location.spec in message
    assert f"host {socket.gethostname()}, pid {pid}, launch {launch_id}, since 20" in message
    assert location.secret is None or location.secret not in message


# -- the lease ----------------------------------------------------------------------------------------------


def test_a_second_attempt_is_refused_after_its_wait_in_one_line_naming_the_holder(location):
    first = open_checkpoint_lease(location.spec, location.environ, "first-launch").acquire()
    try:
        second = location.lease("second-launch", 1.0, poll_seconds=0.25)
        started = time.monotonic()
        with pytest.raises(LeaseHeldError) as refused:
            second.acquire()
        assert time.monotonic() - started >= 1.0  # it waited its whole bound before giving up
        assert_names_holder(str(refused.value), location, os.getpid(), "first-launch")
        assert "wait for that attempt to end, or end that process" in str(refused.value)
        assert f"{WAIT_VARIABLE} sets how long to wait" in str(refused.value)
        assert location.store().names() == []  # the lease is no checkpoint object
    finally:
        first.release()
    with location.lease("third-launch", 0) as third:  # the refused attempt kept nothing locked
        assert third.holder() is not None and third.holder().launch_id == "third-launch"


def test_a_waiting_attempt_gets_the_lease_once_its_holder_releases_it(location):
    first = location.lease("first-launch", 0).acquire()
    waiting = threading.Event()

    def sleep(seconds: float) -> None:
        waiting.set()
        threading.Event().wait(seconds)

    second = location.lease("second-launch", RESULT_TIMEOUT_S, poll_seconds=0.2, sleep=sleep)
    with ThreadPoolExecutor(1) as executor:
        acquired = executor.submit(second.acquire)
        assert waiting.wait(RESULT_TIMEOUT_S) and not acquired.done()
        first.release()
        assert acquired.result(RESULT_TIMEOUT_S) is second
    try:
        assert not second.lost and second.holder().launch_id == "second-launch"
    finally:
        second.release()


_HOLD_UNTIL_KILLED = """
import sys
from pathlib import Path
spec, lease_seconds = sys.argv[1], int(sys.argv[2])
if spec.startswith("http"):
    import os
    from core.errors import CheckpointError
    from core.storage.blob import open_container
    from training.checkpoint.lease import BlobCheckpointLease
    key = os.environ["RETRAIN_STORAGE_CONNECTION_STRING"]
    container, prefix = open_container(spec, key, "checkpoint store URL", CheckpointError)
    lease = BlobCheckpointLease(container, prefix, "doomed-launch", 0, lease_seconds=lease_seconds)
else:
    from training.checkpoint.lease import LocalCheckpointLease
    lease = LocalCheckpointLease(Path(spec), "doomed-launch", 0)
lease.acquire()
print("held", flush=True)
sys.stdin.read()  # until killed
"""


def hold_in_a_process_then_kill_it(location: Location) -> int:
    """A holder that takes the lease and is then SIGKILLed (no clean-up runs); returns its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_UNTIL_KILLED, location.spec, str(SHORTEST_BLOB_LEASE_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **location.environ},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(LeaseHeldError) as refused:  # while it lives, it holds the lease
            location.lease("second-launch", 0).acquire()
        assert_names_holder(str(refused.value), location, holder.pid, "doomed-launch")
    finally:
        holder.kill()
        holder.wait()
    assert holder.returncode == -signal.SIGKILL
    return holder.pid


def test_a_local_holder_killed_outright_frees_the_location_at_once(tmp_path):
    location = Location(str(tmp_path / "checkpoints"))
    hold_in_a_process_then_kill_it(location)
    with location.lease("next-launch", 0) as taken_over:  # no wait: the kernel dropped the dead lock
        assert taken_over.holder().launch_id == "next-launch"


def test_a_renewed_blob_lease_outlives_its_duration_while_a_killed_holders_expires(azurite):
    live_location, dead_location = (
        Location(f"{azurite.container_url(c.container_name)}/{PREFIX}", {}, c)
        for c in (azurite.new_container(), azurite.new_container())
    )
    dead_location.environ = {CONNECTION_STRING_VARIABLE: azurite.connection_string}
    live = live_location.lease("live-launch", 0, lease_seconds=SHORTEST_BLOB_LEASE_S).acquire()
    try:
        hold_in_a_process_then_kill_it(dead_location)
        # Both wait longer than a lease lasts: the renewed one is still held, the dead one has expired.
        waits = SHORTEST_BLOB_LEASE_S + 1
        on_live = live_location.lease("waiting-launch", waits, poll_seconds=1.0)
        on_dead = dead_location.lease("next-launch", RESULT_TIMEOUT_S, poll_seconds=1.0)
        with ThreadPoolExecutor(2) as executor:
            refused, taken_over = executor.submit(on_live.acquire), executor.submit(on_dead.acquire)
            with pytest.raises(LeaseHeldError, match="launch live-launch"):
                refused.result(RESULT_TIMEOUT_S)
            assert taken_over.result(RESULT_TIMEOUT_S) is on_dead
        assert not live.lost
        assert on_dead.holder().launch_id == "next-launch" and not on_dead.lost
        on_dead.release()
    finally:
        live.release()
        for location in (live_location, dead_location):
            location.container.delete_container()


# -- a lost lease stops the writer -------------------------------------------------------------------------


def test_a_blob_lease_broken_from_outside_is_lost_at_its_next_renewal_and_its_store_refuses_writes(
    blob_container,
):
    location = Location("", container=blob_container)
    lease = location.lease("first-launch", 0, lease_seconds=SHORTEST_BLOB_LEASE_S).acquire()
    store = LeasedStore(BlobCheckpointStore(blob_container, PREFIX), lease)
    with store.writer("before.json") as target:
        target.write(b"{}")
    BlobLeaseClient(blob_container.get_blob_client(f"{PREFIX}/{LEASE_NAME}")).break_lease(
        lease_break_period=0
    )
    # The renewal ends at its first failure: wait for that.
    lease.storage_lease.renewal.thread.join(RESULT_TIMEOUT_S)
    assert lease.lost
    assert_writes_refused(store)
    lease.release()
    with location.lease("next-launch", 0):  # broken, it is free for the next attempt
        pass


def test_a_local_lease_whose_file_was_removed_is_lost_and_its_store_refuses_writes(tmp_path):
    lease = LocalCheckpointLease(tmp_path / "checkpoints", "first-launch", 0).acquire()
    store = LeasedStore(LocalCheckpointStore(tmp_path / "checkpoints"), lease)
    with store.writer("before.json") as target:
        target.write(b"{}")
    (tmp_path / "checkpoints" / LEASE_NAME).unlink()  # another attempt could now lock a new lease file
    assert lease.lost
    assert_writes_refused(store)
    lease.release()


def assert_writes_refused(store: LeasedStore) -> None:
    for write in (
        lambda: store.writer("after.json"),
        lambda: store.delete("before.json"),
        store.discard_incomplete,
    ):
        with pytest.raises(LeaseLostError, match="lost its lease on checkpoint location") as refused:
            write()
        assert "\n" not in str(refused.value)
    assert store.names() == ["before.json"] and store.read("before.json") == b"{}"  # reads go on


def test_a_failed_renewal_loses_the_lease_once_and_a_stalled_one_before_the_lease_can_expire(caplog):
    def refuse() -> None:
        raise ConnectionError("the service is gone")

    failed = LeaseRenewal(refuse, 0.01, 1.0, "the test lease")
    failed.thread.join(RESULT_TIMEOUT_S)
    assert failed.lost
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "lost the test lease: ConnectionError"
    ]

    now = [0.0]  # a renewal every 10 s of a 30 s lease, on a clock the test moves: none ever succeeds
    stalled = LeaseRenewal(lambda: None, 10.0, 30.0, "a stalled lease", clock=lambda: now[0])
    now[0] = 19.9
    assert not stalled.lost
    now[0] = 20.0  # no renewal for the lease's duration less one period: it may expire before the next one
    assert stalled.lost
    stalled.stop()


@pytest.mark.parametrize("value", ["soon", "-1", "481", "nan"])
def test_a_bad_wait_is_refused_in_one_line_saying_what_to_set(tmp_path, value):
    with pytest.raises(
        CheckpointError, match=f"{WAIT_VARIABLE}='{value}': expected a number of seconds from 0"
    ):
        open_checkpoint_lease(str(tmp_path), {WAIT_VARIABLE: value}, "a-launch")


# -- end to end: two `retrain train` on one location -------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted_single_process(
    prepared_data: Path, tmp_path_factory: pytest.TempPathFactory, warm_starts: WarmStarts
) -> dict:
    """The reference for one-process attempts: the small run, never interrupted. (One process adds up a
    global batch's gradients in another order than two, so its weights differ from `uninterrupted_run`'s.)"""
    root = tmp_path_factory.mktemp("uninterrupted-single")
    process = warm_starts.training(
        [*train_arguments(prepared_data, root / "out", root / "checkpoints", nproc=1), *NO_TRACKING],
        stderr=(root / "stderr.log").open("w"),
    )
    assert process.finish() == 0, (root / "stderr.log").read_text()[-3000:]
    return read_metadata(root / "out")


class Attempt:
    """`retrain train` whose stderr the test reads line by line as it comes (no polling of a log file)."""

    def __init__(self, arguments: list[str], environ: dict[str, str]) -> None:
        read_end, write_end = os.pipe()
        with os.fdopen(write_end, "w") as stderr:  # the child keeps its copy; ours closes here
            self.process = TrainingProcess(arguments, env={**os.environ, **environ}, stderr=stderr)
        self.lines: list[str] = []
        self._arrived: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(os.fdopen(read_end),), daemon=True)
        self._reader.start()

    def _read(self, stderr: Any) -> None:
        with stderr:
            for line in stderr:
                self.lines.append(line)
                self._arrived.put(line)
        self._arrived.put(None)

    def wait_for_line(self, text: str) -> str:
        while (line := self._arrived.get(timeout=RESULT_TIMEOUT_S)) is not None:
            if text in line:
                return line
        raise AssertionError(f"the attempt ended without {text!r}: {''.join(self.lines)[-3000:]}")

    def finish(self) -> int:
        code = self.process.finish()
        self._reader.join(RESULT_TIMEOUT_S)
        return code

    def error_lines(self) -> list[str]:
        return [line for line in self.lines if line.startswith("retrain: error:")]


def test_two_attempts_at_once_one_trains_while_the_other_waits_then_finds_the_run_done(
    location, prepared_data, tmp_path, uninterrupted_single_process
):
    environ = {**location.environ, WAIT_VARIABLE: str(RESULT_TIMEOUT_S)}
    # The test holds the location first, so that both attempts are surely waiting for it at once.
    earlier = location.lease("earlier-launch", 0).acquire()
    attempts = []
    try:
        for name in ("a", "b"):
            arguments = train_arguments(prepared_data, tmp_path / f"out-{name}", location.spec, nproc=1)
            attempts.append(Attempt([*arguments, *NO_TRACKING], environ))
        for attempt in attempts:
            assert "launch earlier-launch" in attempt.wait_for_line("waiting up to")
    finally:
        earlier.release()
    with ThreadPoolExecutor(2) as executor:
        codes = list(executor.map(Attempt.finish, attempts))
    assert codes == [0, 0], [attempt.lines[-5:] for attempt in attempts]

    # One trained the whole run; the other waited until it was done and resumed its final checkpoint, so it
    # never wrote beside it: no checkpoint of a second attempt, and both outputs hold the same weights.
    trained, waited = sorted((read_metadata(tmp_path / f"out-{n}") for n in "ab"), key=lambda m: m["resumes"])
    assert (trained["resumes"], trained["steps"], len(trained["attempts"])) == (0, TOTAL_STEPS, 1)
    first = trained["attempts"][0]
    assert waited["attempts"][0] == first and waited["attempts"][1]["started_at_step"] == TOTAL_STEPS
    assert {name.rsplit("-", 1)[1] for name in location.store().names()} == {"a001.json", "a001.pt"}
    reference = uninterrupted_single_process["weights_sha256"]
    assert trained["weights_sha256"] == waited["weights_sha256"] == reference
    assert location.secret is None or all(location.secret not in "".join(a.lines) for a in attempts)


def refused_attempt(
    location: Location, prepared_data: Path, out: Path, nproc: int, capsys, monkeypatch
) -> str:
    """`retrain train` (in this process: the refusal comes before any training) started, with no wait, on a
    location the test holds; returns its stderr."""
    for name, value in {**location.environ, WAIT_VARIABLE: "0"}.items():
        monkeypatch.setenv(name, value)
    arguments = train_arguments(prepared_data, out, location.spec, nproc=nproc)
    with location.lease("holding-launch", 0):
        assert main(["train", *arguments, *NO_TRACKING, "--progress", "none"]) == 2
    stderr = capsys.readouterr().err
    [line] = [line for line in stderr.splitlines() if line.startswith("retrain: error:")]
    assert_names_holder(line, location, os.getpid(), "holding-launch")
    assert not out.exists() and location.store().names() == []
    return stderr


def test_an_attempt_on_a_held_location_is_refused_in_one_line_and_writes_nothing(
    location, prepared_data, tmp_path, capsys, monkeypatch
):
    refused_attempt(location, prepared_data, tmp_path / "out", 1, capsys, monkeypatch)


def test_the_launcher_refuses_a_held_location_before_torchrun_starts(
    prepared_data, tmp_path, capsys, monkeypatch
):
    location = Location(str(tmp_path / "checkpoints"))
    stderr = refused_attempt(location, prepared_data, tmp_path / "out", 2, capsys, monkeypatch)
    assert "Traceback" not in stderr and "torch.distributed" not in stderr


def test_an_attempt_that_loses_its_lease_stops_at_its_next_save_without_writing(prepared_data, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    arguments = train_arguments(prepared_data, tmp_path / "out", checkpoints, nproc=1)
    # Epochs enough that the run cannot end before the test acts; it stops at its next save instead.
    attempt = Attempt([*arguments, *NO_TRACKING, "--epochs", "100"], {})
    attempt.process.wait_for(is_checkpoint(10))
    (checkpoints / LEASE_NAME).unlink()  # from now on another attempt could take the location
    store = LocalCheckpointStore(checkpoints)
    committed_when_lost = set(committed_checkpoints(store.names()))
    assert attempt.finish() == 2
    [line] = attempt.error_lines()
    assert f"lost its lease on checkpoint location {checkpoints}" in line
    assert not (tmp_path / "out").exists()  # it wrote no model either
    # No save began once the lease was lost; at most the one already committing then became durable.
    assert len(set(committed_checkpoints(store.names())) - committed_when_lost) <= 1
