"""Array shards: a split written as bounded `.npy` files, and read back memory-mapped as a map-style split.

A data set larger than memory trains as if it were held. `split_shards` cuts a split's inputs (`[rows,
...]`, any fixed-size numeric dtype) and targets (`[rows]`) into shards of at most `SHARD_BYTES` of inputs
each; `open_split` maps them read-only, after checking each file against its sha256, as a `MappedSplit`,
which answers the engine's batches by its global sample indices, a whole batch in one call, as
`TensorSplit` does for tensors. The bytes stay in the kernel's page cache, shared by every rank on a node;
the pages a process's batches mapped in are handed back once `RESIDENT_BYTES` of them may be, so what a
rank holds of the data is bounded by that budget, not by the data set.

This is the task contract's helper for a task's own data (training/tasks/base.py): `prepare` writes each
split's files and records the returned `Shard`s in its manifest; `load` opens them with `open_split`.
"""

from __future__ import annotations

import hashlib
import io
import mmap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.errors import InputError
from core.files import file_sha256

SHARD_BYTES = 64 << 20  # inputs per shard: large files read well, and one shard is cheap to rewrite
RESIDENT_BYTES = 64 << 20  # the mapped pages a split lets its process keep before handing them back
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


class _Mapped:
    """One `.npy` file mapped read-only, as an array that reads through the mapping."""

    def __init__(self, path: Path) -> None:
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
            offset = stream.tell()
            self._map = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)  # never empty: a header
        count = int(np.prod(shape, dtype=np.int64))
        self.array = np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(shape)

    def release(self) -> None:
        """Hand the pages this process mapped in back to the page cache; they are read again on use."""
        self._map.madvise(mmap.MADV_DONTNEED)


class MappedSplit:
    """A map-style split over memory-mapped shards: `split[indices]` (a 1-D tensor, array or list of global
    row indices, or a slice) returns the batch `(inputs, targets)` as tensors of their own; `split[i]` one
    row. `len()` is the rows of every shard, in shard order."""

    def __init__(
        self, inputs: Sequence[_Mapped], targets: Sequence[_Mapped], resident_bytes: int = RESIDENT_BYTES
    ) -> None:
        if not inputs or len(inputs) != len(targets):
            raise InputError("a mapped split needs at least one shard, each with inputs and targets")
        self._inputs, self._targets = list(inputs), list(targets)
        counts = [len(mapped.array) for mapped in self._targets]
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        first = self._inputs[0].array
        self._row_shape, self._dtype = first.shape[1:], first.dtype
        self._target_dtype = self._targets[0].array.dtype
        # A row read maps in at least a page of each of its two files; a larger row, its own bytes.
        row_bytes = first.itemsize * int(np.prod(self._row_shape, dtype=np.int64))
        self._row_cost = max(mmap.PAGESIZE, row_bytes) + mmap.PAGESIZE
        # A split whose files fit in the budget is never handed back: it cannot map in more than itself.
        mappable = sum(mapped.array.nbytes for mapped in (*self._inputs, *self._targets))
        self._budget = None if mappable <= resident_bytes else resident_bytes
        self._mapped_in = 0

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
        if len(self._inputs) == 1:  # one shard: one gather per file
            inputs, targets = self._inputs[0].array[rows], self._targets[0].array[rows]
        else:
            inputs = np.empty((len(rows), *self._row_shape), dtype=self._dtype)
            targets = np.empty(len(rows), dtype=self._target_dtype)
            shard_of = np.searchsorted(self._starts, rows, side="right") - 1
            for shard in np.unique(shard_of):
                chosen = shard_of == shard
                local = rows[chosen] - self._starts[shard]
                inputs[chosen] = self._inputs[shard].array[local]
                targets[chosen] = self._targets[shard].array[local]
        self._account(len(rows))
        return torch.from_numpy(inputs), torch.from_numpy(targets)

    def _account(self, rows: int) -> None:
        """Count what the rows read may have mapped in; past the budget, hand every mapped page back."""
        if self._budget is None:
            return
        self._mapped_in += rows * self._row_cost
        if self._mapped_in > self._budget:
            for mapped in (*self._inputs, *self._targets):
                mapped.release()
            self._mapped_in = 0


def open_split(folder: Path, shards: Sequence[Shard], resident_bytes: int = RESIDENT_BYTES) -> MappedSplit:
    """The split whose `shards` lie in `folder`, each file checked against its sha256 first (read in chunks,
    so the check holds no more than a read buffer); a file that differs or cannot be read is an
    InputError naming it."""
    inputs, targets = [], []
    for shard in shards:
        for name, digest, into in (
            (shard.inputs, shard.inputs_sha256, inputs),
            (shard.targets, shard.targets_sha256, targets),
        ):
            path = Path(folder) / name
            try:
                actual = file_sha256(path)
            except OSError as error:
                raise InputError(f"{path}: cannot read the shard ({error.strerror})") from error
            if actual != digest:
                raise InputError(f"{path}: sha256 differs from the manifest, the shard was changed")
            into.append(_Mapped(path))
    return MappedSplit(inputs, targets, resident_bytes)
