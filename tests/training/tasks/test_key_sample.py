"""The drift check's bounded sample: at most `limit` keys, the same ones whatever the order or chunking
of the rows, every delivery of a chosen key kept, and a table within the limit kept whole."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from training.tasks.tabular.key_sample import KeySample
from training.tasks.tabular.schema import TableSchema

SCHEMA = TableSchema(key_column="id", label_column="y", feature_columns=("x",), n_classes=2)


def _rows(keys: list[str]) -> pa.Table:
    return pa.table({"id": keys, "x": np.arange(len(keys), dtype=np.float64)})


def _sampled(tables: list[pa.Table], limit: int) -> pa.Table:
    sample = KeySample(SCHEMA, limit)
    for table in tables:
        sample.add(table)
    table = sample.table()
    assert table is not None
    return table


def test_the_sample_is_the_same_keys_whatever_the_order_and_chunks():
    rng = np.random.default_rng(5)
    keys = [f"k{number}" for number in range(1000)] + [f"k{number}" for number in range(0, 1000, 10)]
    shuffled = [keys[index] for index in rng.permutation(len(keys))]

    whole = _sampled([_rows(keys)], limit=100)
    chunked = _sampled([_rows(shuffled[start : start + 37]) for start in range(0, len(shuffled), 37)], 100)

    chosen = set(whole.column("id").to_pylist())
    assert len(chosen) == 100
    assert set(chunked.column("id").to_pylist()) == chosen
    deliveries = {key: keys.count(key) for key in chosen}  # a re-delivered key keeps every delivery
    assert chunked.num_rows == whole.num_rows == sum(deliveries.values())


def test_a_table_within_the_limit_is_kept_whole():
    table = _rows([f"k{number}" for number in range(50)])

    assert _sampled([table.slice(0, 20), table.slice(20)], limit=100).num_rows == 50
