"""Early writeback (training/checkpoint/writeback.py): a hint, never a change to what is written."""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
from pathlib import Path

import pytest

from training.checkpoint.writeback import WritebackFile

CHUNK = 4096  # small, so that a few KiB already cross many chunk boundaries


def _writes(data: bytes, sizes: list[int]) -> list[bytes]:
    pieces, start = [], 0
    for size in sizes:
        pieces.append(data[start : start + size])
        start += size
    return pieces


# Writes smaller than a chunk, exactly one, spanning several, and a tail: every boundary case.
SIZES = [1, CHUNK - 1, 1, CHUNK, 3 * CHUNK + 5, 17, 2 * CHUNK - 17, 0, 9000]


def test_a_file_gets_exactly_the_bytes_written_across_chunk_boundaries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = random.Random(0).randbytes(sum(SIZES))
    path = tmp_path / "object"
    with caplog.at_level(logging.DEBUG, logger="training.checkpoint.writeback"), open(path, "wb") as target:
        file = WritebackFile(target, chunk_bytes=CHUNK)
        for piece in _writes(data, SIZES):
            assert file.write(memoryview(piece)) == len(piece)
        file.flush()
        os.fsync(file.fileno())
    assert path.read_bytes() == data
    assert caplog.records == []  # a regular file takes the hint


def test_a_typed_buffer_is_written_as_its_bytes(tmp_path: Path) -> None:
    """A tensor's bytes come as a memoryview of another item size (a float32 array's): written byte for
    byte, its length counted in bytes."""
    values = memoryview(bytearray(random.Random(1).randbytes(4 * 3000))).cast("f")
    path = tmp_path / "object"
    with open(path, "wb") as target:
        assert WritebackFile(target, chunk_bytes=CHUNK).write(values) == 4 * 3000
    assert path.read_bytes() == values.tobytes()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the hint is Linux's sync_file_range")
def test_a_file_that_refuses_the_hint_still_gets_every_byte(caplog: pytest.LogCaptureFixture) -> None:
    """A pipe has no pages to write back (sync_file_range fails with ESPIPE): the file turns the hint off
    after the first refusal and writes on."""
    data = random.Random(2).randbytes(5 * CHUNK + 3)
    read_end, write_end = os.pipe()
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(_read_all(read_end)))
    reader.start()
    with (
        caplog.at_level(logging.DEBUG, logger="training.checkpoint.writeback"),
        open(write_end, "wb") as target,
    ):
        file = WritebackFile(target, chunk_bytes=CHUNK)
        for piece in _writes(data, [CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 2]):
            file.write(piece)
        file.flush()
    reader.join()
    assert received == [data]
    assert [record.message for record in caplog.records] == [
        "early writeback is off for this file: Illegal seek"
    ]


def _read_all(fd: int) -> bytes:
    with open(fd, "rb") as source:
        return source.read()
