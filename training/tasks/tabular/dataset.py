"""Load a prepared data version for training: each split's shards (one per part), checked against the
manifest and opened (training/data/shards.py) less the rows later deliveries superseded, so a
rank holds a bounded budget of the data, not all of it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from core.errors import InputError
from training.data.shards import ShardSplit, open_split
from training.data.splits import SPLIT_NAMES
from training.tasks.tabular.manifest import Manifest, read_manifest
from training.tasks.tabular.parts import read_dead
from training.tasks.tabular.schema import RERUN_HINT, TableSchema

log = logging.getLogger(__name__)

# A feature (near-)constant in the training split (digits' corner pixels are always 0) gets std 1: dividing
# by a tiny std would blow up any value it takes elsewhere, while 1 leaves it merely centred.
CONSTANT_STD_BELOW = 1e-6


@dataclass(frozen=True)
class SplitData:
    """One split: `rows` gives batches `(features float32 [n, F] in the schema's column order, labels int64
    [n])` by row index; `whole` [F] says whether each feature holds only whole numbers here (read from the
    float64 values when prepared, before float32 could round a large fractional value to a whole one)."""

    name: str
    rows: ShardSplit
    whole: tuple[bool, ...]

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class PreparedData:
    """A prepared data version whose shards matched their manifest when opened."""

    data_dir: Path
    manifest: Manifest
    splits: Mapping[str, SplitData]

    @property
    def data_version(self) -> str:
        return self.manifest.data_version

    @property
    def schema(self) -> TableSchema:
        return self.manifest.schema

    def split(self, name: str) -> SplitData:
        if name not in self.splits:
            raise InputError(f"no split named {name!r}; expected one of {', '.join(SPLIT_NAMES)}")
        return self.splits[name]

    @property
    def normalization(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Train-split (mean, std) per feature as float32 tensors; std 1 for constant features."""
        mean = torch.tensor(self.manifest.normalization.mean, dtype=torch.float32)
        std = torch.tensor(self.manifest.normalization.std, dtype=torch.float32)
        return mean, torch.where(std < CONSTANT_STD_BELOW, torch.ones_like(std), std)

    @property
    def whole_number_features(self) -> list[str]:
        """The feature columns holding only whole numbers in every split: the columns a raw file of this
        data has as integers (`pandas.read_csv` reads them as int64), whatever a few rows would suggest."""
        columns = self.schema.feature_columns or ()
        return [
            name
            for position, name in enumerate(columns)
            if all(split.whole[position] for split in self.splits.values())
        ]


def load_prepared(data_dir: Path) -> PreparedData:
    """Read the manifest in `data_dir` and open every split's shards, checking each file's sha256 against
    the manifest. Raises InputError (saying to re-run prepare) when the manifest is missing or a file
    differs from it."""
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    splits = {}
    for index, name in enumerate(SPLIT_NAMES):
        entries = [part.splits[index] for part in manifest.parts]
        dead = [None if entry.dead is None else read_dead(data_dir, entry) for entry in entries]
        try:
            rows = open_split(data_dir, [entry.shard for entry in entries], dead=dead)
        except InputError as error:
            raise InputError(f"{error}; {RERUN_HINT}") from None
        splits[name] = SplitData(name=name, rows=rows, whole=manifest.split_whole(name))
    log.info(
        "loaded data version %s from %s: %s",
        manifest.data_version,
        data_dir,
        ", ".join(f"{name} {len(split)}" for name, split in splits.items()),
    )
    return PreparedData(data_dir=data_dir, manifest=manifest, splits=splits)
