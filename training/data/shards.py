"""Array shards: a split written as bounded `.npy` files, and read back as a map-style split.

A data set larger than memory trains as if it were held. `split_shards` cuts a split's inputs (`[rows,
...]`, any fixed-size numeric dtype) and targets (`[rows]`) into shards of at most `SHARD_BYTES` of inputs
each; `open_split` opens them, after checking each file against its sha256, as a `ShardSplit`, which
answers the engine's batches by its global sample indices, a whole batch in one call, as `TensorSplit`
does for tensors. A split within `RESIDENT_BYTES` is held; a larger one is read a batch at a time from the
kernel's page cache, shared by every rank on a node, so what a rank holds of the data is bounded by that
budget, not by the data set.

This is the task contract's helper for a task's own data (training/tasks/base.py): `prepare` writes each
split's files and records the returned `Shard`s in its manifest; `load` opens them with `open_split`.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.errors import InputError
from core.files import check_file_sha256

SHARD_BYTES = 64 << 20  # inputs per shard: large files read well, and one shard is cheap to rewrite
RESIDENT_BYTES = 64 << 20  # a split this small is held in memory; a larger one is read a batch at a time
_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


@dataclass(frozen=True)
class Shard:
    """One shard of a split as a manifest records it: its inputs' and targets' files, rows and sha256s."""

    inputs: str
    targets: str
    rows: int
    inputs_sha256: str
    targets_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Shard:
        return cls(
            str(data["inputs"]),
            str(data["targets"]),
            int(data["rows"]),
            str(data["inputs_sha256"]),
            str(data["targets_sha256"]),
        )


def split_shards(
    name: str, inputs: np.ndarray, targets: np.ndarray, shard_bytes: int = SHARD_BYTES
) -> tuple[dict[str, bytes], list[Shard]]:
    """Split `name`'s arrays as shard files (`<name>-00000.inputs.npy`, `<name>-00000.targets.npy`, ...):
    their bytes by file name, to publish with the rest of the version, and the shards in order. A split
    of no rows still has one (empty) shard, so that its row shape is on disk."""
    if len(inputs) != len(targets):
        raise InputError(
            f"split {name}: {len(inputs)} inputs beside {len(targets)} targets; expected one each"
        )
    row_bytes = max(1, int(np.prod(inputs.shape[1:], dtype=np.int64)) * inputs.dtype.itemsize)
    per_shard = max(1, shard_bytes // row_bytes)
    files: dict[str, bytes] = {}
    shards = []
    for number, start in enumerate(range(0, max(len(targets), 1), per_shard)):
        names = (f"{name}-{number:05d}.inputs.npy", f"{name}-{number:05d}.targets.npy")
        payloads = tuple(_npy(array[start : start + per_shard]) for array in (inputs, targets))
        files.update(zip(names, payloads, strict=True))
        digests = tuple(hashlib.sha256(payload).hexdigest() for payload in payloads)
        rows = len(targets[start : start + per_shard])
        shards.append(Shard(names[0], names[1], rows, digests[0], digests[1]))
    return files, shards


def _npy(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, np.ascontiguousarray(array), allow_pickle=False)
    return stream.getvalue()


class _ArrayFile:
    """One `.npy` shard file, by its header: its shape, dtype and where its values start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as stream:
            try:
                reader = _HEADER_READERS[np.lib.format.read_magic(stream)]
                shape, fortran_order, dtype = reader(stream)
            except (KeyError, ValueError) as error:
                raise InputError(
                    f"{path}: not an array shard ({error}); expected a file split_shards wrote"
                ) from None
            if fortran_order or dtype.hasobject:
                raise InputError(f"{path}: not a C-ordered numeric array; expected a file split_shards wrote")
            self.offset = stream.tell()
        self.shape, self.dtype = tuple(shape), dtype
        self.row_bytes = dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        if path.stat().st_size != self.offset + self.row_bytes * self.rows:
            raise InputError(
                f"{path}: its size is not its header's {self.shape}; expected a file split_shards wrote"
            )

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 0

    def read_all(self) -> np.ndarray:
        with self.path.open("rb") as stream:
            stream.seek(self.offset)
            return np.fromfile(stream, dtype=self.dtype, count=int(np.prod(self.shape))).reshape(self.shape)

    def read_rows(self, rows: np.ndarray, into: np.ndarray, at: np.ndarray) -> None:
        """Rows `rows` of the file into rows `at` of `into` (C-contiguous), one positioned read per row: the
        kernel copies from its page cache, so nothing of the file stays in the process."""
        view, size, offset = memoryview(into.reshape(-1).view(np.uint8)), self.row_bytes, self.offset
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for row, index in zip(rows.tolist(), at.tolist(), strict=True):
                if os.preadv(fd, [view[index * size : (index + 1) * size]], offset + row * size) != size:
                    raise InputError(f"{self.path}: shorter than its header says; expected a shard file")
        finally:
            os.close(fd)


class ShardSplit:
    """A map-style split over shard files: `split[indices]` (a 1-D tensor, array or list of global row
    indices, or a slice) returns the batch `(inputs, targets)` as tensors of their own; `split[i]` one row.
    `len()` is the live rows of every shard, in shard order.

    A split whose live rows fit `resident_bytes` is read into memory once, so its batches cost what a held
    tensor's do. A larger one reads each batch's rows from the files with positioned reads: the process
    holds a batch, never the split, and the kernel's page cache (shared by every rank on the node, and not
    the process's memory) keeps what is read often. Not memory maps: a fault on a mapped file maps in the
    whole page-cache folio it lands in (megabytes on current kernels), so a random batch would bring most
    of a large file into the process, and its peak memory would grow with the data after all."""

    def __init__(
        self,
        inputs: Sequence[_ArrayFile],
        targets: Sequence[_ArrayFile],
        resident_bytes: int = RESIDENT_BYTES,
        dead: Sequence[np.ndarray | None] | None = None,
    ) -> None:
        if not inputs or len(inputs) != len(targets):
            raise InputError("a shard split needs at least one shard, each with inputs and targets")
        for input_file, target_file in zip(inputs, targets, strict=True):
            if input_file.rows != target_file.rows or len(target_file.shape) != 1:
                raise InputError(
                    f"{target_file.path}: not one target per input row; expected split_shards' files"
                )
            if (input_file.shape[1:], input_file.dtype) != (inputs[0].shape[1:], inputs[0].dtype):
                raise InputError(
                    f"{input_file.path}: rows of another shape or type than the split's first shard"
                )
        self._inputs, self._targets = list(inputs), list(targets)
        counts = np.array([file.rows for file in self._targets], dtype=np.int64)
        # Rows a later version superseded are skipped: each shard's sorted dead positions, kept as
        # `dead[j] - j`, turn a live position into a stored one with one search (live i is stored
        # i + #{j : dead[j] - j <= i}), so the mapping costs the dead rows' memory, not the split's.
        self._skips = [
            _skips(positions, count)
            for positions, count in zip(dead or [None] * len(counts), counts, strict=True)
        ]
        live = counts - np.array([len(skip) for skip in self._skips], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(live, dtype=np.int64)])
        self._row_shape, self._dtype = inputs[0].shape[1:], inputs[0].dtype
        self._target_dtype = targets[0].dtype
        row_bytes = inputs[0].row_bytes + targets[0].row_bytes
        self._held = self._hold() if len(self) * row_bytes <= resident_bytes else None

    def _hold(self) -> tuple[np.ndarray, np.ndarray]:
        inputs, targets = [], []
        for shard, (input_file, target_file) in enumerate(zip(self._inputs, self._targets, strict=True)):
            local = self._stored(shard, np.arange(self._starts[shard + 1] - self._starts[shard]))
            inputs.append(input_file.read_all()[local])
            targets.append(target_file.read_all()[local])
        return np.concatenate(inputs), np.concatenate(targets)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(index, int | np.integer):
            inputs, targets = self[np.array([int(index)])]
            return inputs[0], targets[0]
        if isinstance(index, slice):
            rows = np.arange(len(self), dtype=np.int64)[index]
        elif isinstance(index, torch.Tensor):
            rows = index.detach().cpu().numpy().astype(np.int64, copy=False)
        else:
            rows = np.asarray(index, dtype=np.int64)
        if rows.ndim != 1:
            raise IndexError(f"expected a 1-D index of rows, got shape {tuple(rows.shape)}")
        if rows.size and (rows.min() < -len(self) or rows.max() >= len(self)):
            raise IndexError(f"row index out of range for a split of {len(self)} rows")
        rows = np.where(rows < 0, rows + len(self), rows)
        if self._held is not None:
            return torch.from_numpy(self._held[0][rows]), torch.from_numpy(self._held[1][rows])
        inputs = np.empty((len(rows), *self._row_shape), dtype=self._dtype)
        targets = np.empty(len(rows), dtype=self._target_dtype)
        shard_of = np.searchsorted(self._starts, rows, side="right") - 1
        for shard in np.unique(shard_of):
            chosen = np.flatnonzero(shard_of == shard)
            local = self._stored(shard, rows[chosen] - self._starts[shard])
            self._inputs[shard].read_rows(local, inputs, chosen)
            self._targets[shard].read_rows(local, targets, chosen)
        return torch.from_numpy(inputs), torch.from_numpy(targets)

    def _stored(self, shard: int, live: np.ndarray) -> np.ndarray:
        skip = self._skips[shard]
        return live + np.searchsorted(skip, live, side="right") if len(skip) else live


def _skips(dead: np.ndarray | None, rows: int) -> np.ndarray:
    if dead is None or not len(dead):
        return np.zeros(0, dtype=np.int64)
    dead = np.asarray(dead, dtype=np.int64)
    if dead.ndim != 1 or dead[0] < 0 or dead[-1] >= rows or (len(dead) > 1 and (np.diff(dead) <= 0).any()):
        raise InputError(f"dead rows of a shard of {rows} rows: expected increasing positions in [0, {rows})")
    return dead - np.arange(len(dead), dtype=np.int64)


def open_split(
    folder: Path,
    shards: Sequence[Shard],
    resident_bytes: int = RESIDENT_BYTES,
    dead: Sequence[np.ndarray | None] | None = None,
) -> ShardSplit:
    """The split whose `shards` lie in `folder`, each file checked against its sha256 first (read in chunks,
    so the check holds no more than a read buffer); a file that differs or cannot be read is an
    InputError naming it. `dead`, one entry per shard, lists rows a later delivery superseded (sorted
    positions within the shard, or None): the split leaves them out, keeping the others in order."""
    inputs, targets = [], []
    for shard in shards:
        for name, digest, into in (
            (shard.inputs, shard.inputs_sha256, inputs),
            (shard.targets, shard.targets_sha256, targets),
        ):
            path = Path(folder) / name
            check_file_sha256(path, digest, "shard")
            into.append(_ArrayFile(path))
    return ShardSplit(inputs, targets, resident_bytes, dead)
