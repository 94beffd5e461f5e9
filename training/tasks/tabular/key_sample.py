"""A bounded, deterministic sample of a table's rows: those of the keys with the smallest key digests.

Drift compares distributions, which a few hundred thousand rows describe as well as all of them; a sample
keeps the drift step's memory flat however large the data grows. Choosing by key digest (a bottom-k
sketch) makes the sample a uniform one that does not depend on file order or chunking, keeps every
delivery of a chosen key together (so deduplicating the sample is deduplicating the data, for those
keys), and leaves a table smaller than the limit whole: the sample data sets' verdicts are unchanged.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from training.tasks.tabular.parts import key_digests
from training.tasks.tabular.schema import TableSchema

SAMPLE_KEYS = 100_000


class KeySample:
    """Add tables in any order; `table()` holds every row whose key is among the `limit` smallest digests."""

    def __init__(self, schema: TableSchema, limit: int = SAMPLE_KEYS) -> None:
        self._key, self._limit = schema.key_field, limit
        self._table: pa.Table | None = None
        self._digests = np.zeros(0, dtype="S16")

    def add(self, table: pa.Table) -> None:
        digests = key_digests(table.column(self._key).to_pylist())
        held = table if self._table is None else pa.concat_tables([self._table, table])
        digests = np.concatenate([self._digests, digests])
        distinct = np.unique(digests)
        if len(distinct) > self._limit:
            keep = digests <= distinct[self._limit - 1]
            held, digests = held.filter(pa.array(keep)), digests[keep]
        self._table, self._digests = held.combine_chunks(), digests

    def table(self) -> pa.Table | None:
        return self._table
