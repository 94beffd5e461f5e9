"""One row per key: the last delivery wins, and every dropped row is counted as a duplicate or superseded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from training.tasks.tabular.raw_files import row_digests
from training.tasks.tabular.schema import SOURCE_FILE_COLUMN, SOURCE_ROW_COLUMN, TableSchema


@dataclass(frozen=True)
class Deduplicated:
    """One row per key, sorted by key, and how many rows were dropped of each kind; `digests` holds each
    kept row's row digest, and `first_digests` the digest of each key's first delivery in the same order
    (what an earlier delivery of the key, outside the table, is compared with: its next delivery)."""

    table: pa.Table
    exact_duplicates: int
    superseded: int
    digests: np.ndarray
    first_digests: np.ndarray


def deduplicate(table: pa.Table, schema: TableSchema) -> Deduplicated:
    """Keep, for each key, the last delivery: from the file whose name sorts last, then the last row.

    A dropped row counts as an exact duplicate if it equals the next delivery of its key, else as
    superseded; comparing with the next delivery (not the winner) keeps the counts additive, so an
    incremental preparation counts exactly as a full one.
    """
    order = pc.sort_indices(
        table,
        sort_keys=[
            (schema.key_field, "ascending"),
            (SOURCE_FILE_COLUMN, "ascending"),
            (SOURCE_ROW_COLUMN, "ascending"),
        ],
    )
    ordered = table.take(order)
    keys = ordered.column(schema.key_field).to_numpy(zero_copy_only=False)
    digests = row_digests(ordered, schema)
    same_as_next = keys[:-1] == keys[1:]
    equal_to_next = digests[:-1] == digests[1:]
    exact = int(np.count_nonzero(same_as_next & equal_to_next))
    dropped = int(np.count_nonzero(same_as_next))
    kept = np.append(~same_as_next, True) if len(keys) else np.zeros(0, dtype=bool)
    first = np.insert(~same_as_next, 0, True) if len(keys) else np.zeros(0, dtype=bool)
    return Deduplicated(
        ordered.filter(pa.array(kept)),
        exact_duplicates=exact,
        superseded=dropped - exact,
        digests=digests[kept],
        first_digests=digests[first],
    )
