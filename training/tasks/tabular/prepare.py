"""Prepare: raw batch files in, one validated, deduplicated and split data version out.

Steps, all in memory before anything is written: read and validate every raw file (or, incrementally,
only the files a previous version has not seen), keep one row per key, assign each key to a split by a
salted hash of the key alone (so a row never changes split as data grows), and build the manifest. Only
then are the files written, into a staging folder that is moved into place with `manifest.json` last:
each split as Parquet (every column, values exact) and as the shards training maps into memory
(training/data/shards.py: features as float32, labels), with the feature columns that hold only whole
numbers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.errors import InputError
from core.rejected_inputs import RawFilesRejected, rejected_for
from core.text import escaped
from training.data.publish import publish
from training.data.shards import Shard, split_shards
from training.data.splits import SPLIT_NAMES, SplitFractions, assign_splits
from training.data.versions import existing_manifest, same_version_or_refuse
from training.data.whole_numbers import whole_columns
from training.tasks.tabular.raw_files import (
    RawFingerprint,
    fingerprint,
    list_raw_files,
    read_raw_file,
    with_features,
)
from training.tasks.tabular.schema import (
    DIGITS_SCHEMA,
    MANIFEST_NAME,
    SOURCE_FILE_COLUMN,
    SOURCE_ROW_COLUMN,
    Manifest,
    Normalization,
    PrepStats,
    RawFileEntry,
    SplitEntry,
    TableSchema,
    feature_matrix,
    read_manifest,
    read_split_table,
)

log = logging.getLogger(__name__)

_CONTENT_TAG = b"retrain-split-content/1\n"


@dataclass(frozen=True)
class _Gathered:
    """Every row still in play, with provenance, and what is already known about dropped rows."""

    table: pa.Table
    raw_files: tuple[RawFileEntry, ...]
    earlier_drops: tuple[int, int]  # (exact duplicates, superseded) among rows no longer in `table`


@dataclass(frozen=True)
class Deduplicated:
    """One row per key, sorted by key, and how many rows were dropped of each kind."""

    table: pa.Table
    exact_duplicates: int
    superseded: int


def prepare(
    raw: Path,
    out: Path,
    *,
    previous: Path | None = None,
    schema: TableSchema = DIGITS_SCHEMA,
    split: SplitFractions | None = None,
) -> Manifest:
    """Prepare the raw batches in `raw` as a data version in `out` (new or empty) and return its manifest.

    With `previous` (an earlier output), files it already saw unchanged are not re-read: their rows come
    from its prepared splits. The result is identical to a full preparation. A `previous` that does not read
    as a tabular data version (gone, damaged, another task's) is said in one warning and not built on. If
    `out` already holds the same data version this is a no-op returning that manifest. A schema with open
    parts (feature columns, class count) has them fixed here, and the manifest records the result: the
    feature columns as `previous` has them (prepared with these options), else as the header of most of
    the raw data (`with_features`); the class count from the labels. Raw files that do not fit are
    rejected together (RawFilesRejected), each naming itself, before anything is written.
    """
    raw, out = Path(raw), Path(out)
    split = split or SplitFractions()
    existing = existing_manifest(out, read_manifest)
    paths = list_raw_files(raw)
    previous_manifest = _previous_manifest(Path(previous)) if previous is not None else None
    schema = with_features(schema, paths, previous_manifest.schema if previous_manifest else None)
    fingerprints = [fingerprint(path) for path in paths]
    earlier = (Path(previous), previous_manifest) if previous is not None and previous_manifest else None
    gathered = _gather(fingerprints, schema, earlier)
    if gathered.table.num_rows == 0:
        raise InputError(
            f"{escaped(raw)}: its {len(fingerprints)} raw file(s) hold no data rows; expected rows under a "
            f"header of {schema.describe_columns()}"
        )
    deduplicated = deduplicate(gathered.table, schema)
    schema = with_class_count(schema, deduplicated.table, raw)
    tables = _split_tables(deduplicated.table, schema, split, raw)
    payloads: dict[str, bytes] = {}
    entries = []
    for name, table in zip(SPLIT_NAMES, tables, strict=True):
        parquet = payloads[f"{name}.parquet"] = _parquet_bytes(table)
        values = feature_matrix(table, schema)
        labels = table.column(schema.label_column).to_numpy().astype(np.int64)
        shard_files, shards = split_shards(name, values.astype(np.float32), labels)
        payloads.update(shard_files)
        entries.append(_split_entry(name, table, parquet, schema, shards, whole_columns(values)))
    manifest = Manifest(
        schema=schema,
        split=split,
        raw_files=gathered.raw_files,
        splits=tuple(entries),
        stats=_stats(gathered, deduplicated),
        normalization=normalization(feature_matrix(tables[0], schema)),
        previous_version=previous_manifest.data_version if previous_manifest else None,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    if existing is not None:
        return same_version_or_refuse(out, existing, manifest)
    publish(out, {**payloads, MANIFEST_NAME: manifest.to_json().encode()})
    log.info(
        "data version %s: %d unique rows from %d raw rows (%d exact duplicates, %d superseded)",
        manifest.data_version, manifest.stats.unique_rows, manifest.stats.raw_rows,
        manifest.stats.exact_duplicates, manifest.stats.superseded,
    )  # fmt: skip
    return manifest


def _previous_manifest(previous: Path) -> Manifest | None:
    """The previous version's manifest; None, with a warning, when it is not a tabular data version that
    reads (another task's output, a damaged or deleted folder): that costs the increment and the schema it
    would fix, never the preparation."""
    try:
        return read_manifest(previous)
    except (InputError, OSError, UnicodeDecodeError) as error:
        log.warning(
            "not building on %s: %s; preparing all raw files",
            escaped(previous), escaped(str(error).splitlines()[0]),
        )  # fmt: skip
        return None


def _stats(gathered: _Gathered, deduplicated: Deduplicated) -> PrepStats:
    return PrepStats(
        raw_rows=sum(entry.rows for entry in gathered.raw_files),
        unique_rows=deduplicated.table.num_rows,
        exact_duplicates=gathered.earlier_drops[0] + deduplicated.exact_duplicates,
        superseded=gathered.earlier_drops[1] + deduplicated.superseded,
    )


def _gather(
    fingerprints: Sequence[RawFingerprint], schema: TableSchema, previous: tuple[Path, Manifest] | None
) -> _Gathered:
    if previous is not None:
        previous_dir, previous_manifest = previous
        reason = _why_not_incremental(previous_manifest, fingerprints, schema)
        if reason is None:
            try:
                earlier = [read_split_table(previous_dir, previous_manifest, name) for name in SPLIT_NAMES]
            except InputError as error:
                reason = f"its prepared files cannot be reused ({error})"
            else:
                return _incremental(fingerprints, schema, previous_manifest, earlier)
        log.warning(
            "not building on previous version %s: %s; preparing all raw files",
            previous_manifest.data_version, escaped(reason),  # the reason may quote a file's name or data
        )  # fmt: skip
    tables = _read_every(fingerprints, schema)
    entries = tuple(
        _raw_entry(item, table.num_rows) for item, table in zip(fingerprints, tables, strict=True)
    )
    return _Gathered(pa.concat_tables(tables), entries, (0, 0))


def _read_every(fingerprints: Sequence[RawFingerprint], schema: TableSchema) -> list[pa.Table]:
    """Every file read and validated; the files that do not fit are rejected together, each naming itself
    (a bad file costs that file: the prepare step prepares the rest)."""
    tables, rejected, first = [], [], None
    for item in fingerprints:
        try:
            tables.append(read_raw_file(item.path, schema))
        except InputError as error:
            rejected.append(rejected_for(item.path, item.name, error))
            first = first or str(error)
    if rejected:
        raise RawFilesRejected(rejected, first)
    return tables


def _why_not_incremental(
    previous: Manifest, fingerprints: Sequence[RawFingerprint], schema: TableSchema
) -> str | None:
    """Why the previous version cannot be built on, or None when it can."""
    if not schema.accepts(previous.schema):
        return "it was prepared with another table schema"
    current = {item.name: item.sha256 for item in fingerprints}
    for entry in previous.raw_files:
        if entry.name not in current:
            return f"raw file {entry.name} that it saw has been removed"
        if current[entry.name] != entry.sha256:
            return f"raw file {entry.name} has changed since (sha256 differs)"
    seen = {entry.name for entry in previous.raw_files}
    last_seen = max(seen, default="")
    for name in current:
        if name not in seen and name < last_seen:
            # Dedupe ranks deliveries by file name; a late file sorting early would re-rank old rows.
            return f"new raw file {name} sorts before {last_seen}, which it already prepared"
    return None


def _incremental(
    fingerprints: Sequence[RawFingerprint],
    schema: TableSchema,
    previous: Manifest,
    earlier: Sequence[pa.Table],
) -> _Gathered:
    seen = {entry.name: entry for entry in previous.raw_files}
    new = [item for item in fingerprints if item.name not in seen]
    tables = _read_every(new, schema)
    log.info(
        "building on %s: reusing %d rows from %d raw files, reading %d new raw files",
        previous.data_version, sum(table.num_rows for table in earlier), len(seen), len(new),
    )  # fmt: skip
    new_entries = {
        item.name: _raw_entry(item, table.num_rows) for item, table in zip(new, tables, strict=True)
    }
    entries = tuple(seen.get(item.name) or new_entries[item.name] for item in fingerprints)
    drops = (previous.stats.exact_duplicates, previous.stats.superseded)
    reused = [table.replace_schema_metadata(None) for table in earlier]
    return _Gathered(pa.concat_tables([*reused, *tables]), entries, drops)


def with_class_count(schema: TableSchema, table: pa.Table, raw: Path) -> TableSchema:
    """`schema` with an open class count fixed from the data: the largest label + 1 of the range the labels
    fill. A label far beyond the others (999999999 among 0..9) is refused naming its file and row: taken
    as a class count, it would make the model's last layer a billion wide."""
    if schema.n_classes is not None:
        return schema
    labels = table.column(schema.label_column).to_numpy()
    count = inferred_class_count(labels)
    if labels.max() >= count:
        _refuse_beyond(table, schema, raw, labels >= count, count)
    if count < 2:
        raise InputError(
            f"{escaped(raw)}: the label column {schema.label_column!r} holds only class {count - 1}; "
            "expected at least two classes (or set the task option n_classes)"
        )
    return dataclasses.replace(schema, n_classes=int(count))


def inferred_class_count(labels: np.ndarray) -> int:
    """The class count labels (integers >= 0) imply: the largest label L + 1 such that at least half of the
    classes 0..L occur. Classes are indices, so the labels fill their range; one that leaves most of the
    range below it empty is a typo or a code (999999999 for "unknown"), not a class."""
    distinct = np.unique(labels)
    dense = 2 * np.arange(1, len(distinct) + 1) >= distinct + 1
    return int(distinct[dense].max()) + 1 if dense.any() else 0


def _refuse_beyond(table: pa.Table, schema: TableSchema, raw: Path, beyond: np.ndarray, count: int) -> None:
    """One line naming the first row (in file order) whose label is beyond the inferred classes."""
    files = table.column(SOURCE_FILE_COLUMN).to_numpy(zero_copy_only=False)[beyond]
    rows = table.column(SOURCE_ROW_COLUMN).to_numpy()[beyond]
    first = min(range(len(rows)), key=lambda index: (files[index], rows[index]))
    value = table.column(schema.label_column).to_numpy()[beyond][first]
    error = InputError(
        f"{escaped(raw / files[first])}: data row {rows[first]}, column {schema.label_column!r}: expected an "
        f"integer class in [0, {count}), the range the other labels fill, got {value}; if the classes really "
        "go that far, declare them with the task option n_classes (or classes)"
    )
    raise RawFilesRejected([rejected_for(raw / files[first], str(files[first]), error)], str(error))


def _raw_entry(item: RawFingerprint, rows: int) -> RawFileEntry:
    return RawFileEntry(name=item.name, sha256=item.sha256, rows=rows, bytes=item.bytes)


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
    labels = ordered.column(schema.label_column).to_numpy()
    features = feature_matrix(ordered, schema)
    same_as_next = keys[:-1] == keys[1:]
    equal_to_next = (labels[:-1] == labels[1:]) & (features[:-1] == features[1:]).all(axis=1)
    exact = int(np.count_nonzero(same_as_next & equal_to_next))
    dropped = int(np.count_nonzero(same_as_next))
    kept = np.append(~same_as_next, True) if len(keys) else np.zeros(0, dtype=bool)
    return Deduplicated(ordered.filter(pa.array(kept)), exact_duplicates=exact, superseded=dropped - exact)


def _split_tables(
    table: pa.Table, schema: TableSchema, fractions: SplitFractions, raw: Path
) -> list[pa.Table]:
    assignment = assign_splits(table.column(schema.key_field).to_pylist(), fractions)
    tables = [table.filter(pa.array(assignment == index)) for index in range(len(SPLIT_NAMES))]
    for name, split_table in zip(SPLIT_NAMES, tables, strict=True):
        if split_table.num_rows == 0:
            raise InputError(
                f"{escaped(raw)}: too few rows: {table.num_rows} unique rows leave the {name} split empty "
                f"with fractions {_show_fractions(fractions)}; expected more rows (a few dozen at least) "
                "or other --split fractions"
            )
    return tables


def _show_fractions(fractions: SplitFractions) -> str:
    return ", ".join(f"{name}={value:g}" for name, value in fractions.as_dict().items())


def content_sha256(table: pa.Table, schema: TableSchema) -> str:
    """Hash of what a split holds (keys, labels, features in row order), independent of file encoding."""
    keys = table.column(schema.key_field)
    lengths = pc.binary_length(keys).to_numpy(zero_copy_only=False).astype("<i8")
    features = feature_matrix(table, schema)
    digest = hashlib.sha256(_CONTENT_TAG)
    digest.update(np.array(features.shape, dtype="<i8").tobytes())
    digest.update(lengths.tobytes())
    digest.update("".join(keys.to_pylist()).encode())
    digest.update(table.column(schema.label_column).to_numpy().astype("<i8").tobytes())
    digest.update(np.ascontiguousarray(features, dtype="<f8").tobytes())
    return digest.hexdigest()


def normalization(train_features: np.ndarray) -> Normalization:
    """Per-feature mean and population std of the train split, in float64."""
    return Normalization(
        mean=tuple(float(value) for value in train_features.mean(axis=0)),
        std=tuple(float(value) for value in train_features.std(axis=0)),
    )


def _split_entry(
    name: str,
    table: pa.Table,
    payload: bytes,
    schema: TableSchema,
    shards: list[Shard],
    whole: np.ndarray,
) -> SplitEntry:
    return SplitEntry(
        name=name,
        file=f"{name}.parquet",
        rows=table.num_rows,
        file_sha256=hashlib.sha256(payload).hexdigest(),
        content_sha256=content_sha256(table, schema),
        shards=tuple(shards),
        whole=tuple(bool(flag) for flag in whole),
    )


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table.combine_chunks(), sink)
    return sink.getvalue().to_pybytes()
