"""Prepare: raw batch files in, one validated, deduplicated and split data version out, in bounded memory.

Each raw file is read in chunks of a fixed number of rows (training/tasks/tabular/raw_files.py) and each
chunk becomes a part (training/tasks/tabular/parts.py): its rows, one per key, split by a salted hash of
the key alone (so a row never changes split as data grows), written as Parquet (values exact) and as the
shards training reads. A later delivery of a key supersedes the earlier one through a deletion
vector, never by rewriting a part. With a previous version of the same raw files, its parts are shared
(hard links) and only the new raw files are read: its time and memory grow with the new rows, and it gives
the same files and data version a full preparation of all the files gives, since both fold the same parts
in the same order (training/tasks/tabular/folding.py). The version appears at once, manifest last, or not
at all (training/data/publish.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.errors import InputError
from core.rejected_inputs import RawFilesRejected, rejected_for
from core.text import escaped
from training.data.publish import make_parents, publish
from training.data.splits import SPLIT_NAMES, SplitFractions
from training.data.versions import MANIFEST_NAME, existing_manifest, same_version_or_refuse
from training.tasks.tabular.folding import Folding
from training.tasks.tabular.manifest import Manifest, Normalization, PrepStats, RawFileEntry, read_manifest
from training.tasks.tabular.parts import Part, check_files, part_rows
from training.tasks.tabular.raw_files import (
    RawFingerprint,
    fingerprint,
    list_raw_files,
    read_raw_chunks,
    with_features,
)
from training.tasks.tabular.schema import (
    DIGITS_SCHEMA,
    LABEL_NAME,
    SOURCE_FILE_COLUMN,
    SOURCE_ROW_COLUMN,
    TableSchema,
)

log = logging.getLogger(__name__)


def prepare(
    raw: Path,
    out: Path,
    *,
    previous: Path | None = None,
    schema: TableSchema = DIGITS_SCHEMA,
    split: SplitFractions | None = None,
    rows_per_part: int | None = None,
) -> Manifest:
    """Prepare the raw batches in `raw` as a data version in `out` (new or empty) and return its manifest.

    With `previous` (an earlier output), files it already saw unchanged are not re-read: its parts are
    shared and built on. The result is identical to a full preparation. A `previous` that does not read
    as a tabular data version (gone, damaged, another task's) is said in one warning and not built on. If
    `out` already holds the same data version this is a no-op returning that manifest. A schema with open
    parts (feature columns, class count) has them fixed here, and the manifest records the result: the
    feature columns as `previous` has them (prepared with these options), else as the header of most of
    the raw data (`with_features`); the class count from the labels. Raw files that do not fit are
    rejected together (RawFilesRejected), each naming itself, and nothing is written. `rows_per_part` (by
    default `part_rows(schema)`, about PART_BYTES of values) bounds what is held at once.
    """
    raw, out = Path(raw), Path(out)
    split = split or SplitFractions()
    existing = existing_manifest(out, read_manifest)
    paths = list_raw_files(raw)
    previous_manifest = _previous_manifest(Path(previous)) if previous is not None else None
    schema = with_features(schema, paths, previous_manifest.schema if previous_manifest else None)
    fingerprints = [fingerprint(path) for path in paths]
    rows = rows_per_part or part_rows(schema)
    with _scratch(out) as scratch:
        earlier = (Path(previous), previous_manifest) if previous is not None and previous_manifest else None
        folding, seen = _start(earlier, fingerprints, schema, split, rows, scratch)
        raw_entries = _fold(folding, fingerprints, seen, schema, rows)
        parts, dead_files = folding.finished_parts()
        totals = folding.totals()
        unique = sum(part.splits[index].live_rows for part in parts for index in range(len(SPLIT_NAMES)))
        if not unique:
            raise InputError(
                f"{escaped(raw)}: its {len(fingerprints)} raw file(s) hold no data rows; expected rows "
                f"under a header of {schema.describe_columns()}"
            )
        schema = with_class_count(schema, folding, raw)
        _check_splits(parts, unique, split, raw)
        mean, std = totals.mean_std()
        manifest = Manifest(
            schema=schema,
            split=split,
            raw_files=raw_entries,
            part_rows=rows,
            parts=tuple(parts),
            totals=totals,
            stats=PrepStats(
                raw_rows=sum(entry.rows for entry in raw_entries),
                unique_rows=unique,
                exact_duplicates=totals.exact_duplicates,
                superseded=totals.superseded,
            ),
            normalization=Normalization(mean=mean, std=std),
            previous_version=previous_manifest.data_version if previous_manifest else None,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            vocabularies=folding.vocabulary_values(),
        )
        if existing is not None:
            return same_version_or_refuse(out, existing, manifest)
        files: dict[str, bytes | Path] = {}
        for part in parts:
            files.update({name: folding.folder[part.id] / name for name in part.files()})
        files.update(dead_files)
        files[MANIFEST_NAME] = manifest.to_json().encode()
        publish(out, files)
    log.info(
        "data version %s: %d unique rows from %d raw rows (%d exact duplicates, %d superseded)",
        manifest.data_version, manifest.stats.unique_rows, manifest.stats.raw_rows,
        manifest.stats.exact_duplicates, manifest.stats.superseded,
    )  # fmt: skip
    return manifest


@contextlib.contextmanager
def _scratch(out: Path) -> Iterator[Path]:
    """A private folder for the new parts on `out`'s file system (so publishing links, never copies them):
    inside `out` when it exists (an Azure ML output mount, which cannot be replaced), else beside it. It
    goes on every way out, and a file system error within (a full disk, a folder that refuses writes)
    becomes one line naming `out`: nothing of the version is left."""
    created = [] if out.exists() else make_parents(out.parent)
    try:
        folder = Path(tempfile.mkdtemp(prefix=f".{out.name}.parts-", dir=out if out.exists() else out.parent))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    except OSError as error:
        raise InputError(
            f"{escaped(out)}: cannot write the prepared data ({escaped(str(error))}); expected a writable "
            "folder with room for the data version"
        ) from error
    finally:
        if not out.exists():
            for parent in reversed(created):
                with contextlib.suppress(OSError):
                    parent.rmdir()


def _start(
    earlier: tuple[Path, Manifest] | None,
    fingerprints: Sequence[RawFingerprint],
    schema: TableSchema,
    split: SplitFractions,
    rows: int,
    scratch: Path,
) -> tuple[Folding, dict[str, RawFileEntry]]:
    """An empty folding, or one continuing from the previous version when it can be built on; and the raw
    files whose parts it already holds."""
    if earlier is not None:
        previous_dir, previous = earlier
        reason = _why_not_incremental(previous, fingerprints, schema, rows)
        if reason is None:
            try:
                check_files(previous_dir, previous.parts)
                folding = Folding.from_version(previous_dir, previous, schema, scratch)
            except InputError as error:
                reason = f"its prepared files cannot be reused ({error})"
            else:
                log.info(
                    "building on %s: sharing %d parts of %d raw files",
                    previous.data_version, len(previous.parts), len(previous.raw_files),
                )  # fmt: skip
                return folding, {entry.name: entry for entry in previous.raw_files}
        log.warning(
            "not building on previous version %s: %s; preparing all raw files",
            previous.data_version, escaped(reason),  # the reason may quote a file's name or data
        )  # fmt: skip
    return Folding(schema, split, scratch), {}


def _fold(
    folding: Folding,
    fingerprints: Sequence[RawFingerprint],
    seen: dict[str, RawFileEntry],
    schema: TableSchema,
    rows: int,
) -> tuple[RawFileEntry, ...]:
    """Add every chunk of every raw file not `seen`, in order; the files that do not fit are rejected
    together, each naming itself (a bad file costs that file: the prepare step prepares the rest)."""
    entries, rejected, first = [], [], None
    new = [item for item in fingerprints if item.name not in seen]
    if seen:
        log.info("reading %d new raw files", len(new))
    for item in fingerprints:
        if item.name in seen:
            entries.append(seen[item.name])
            continue
        read = 0
        try:
            for number, chunk in enumerate(read_raw_chunks(item.path, schema, rows)):
                if not rejected:  # once a file is rejected nothing is published: just check the rest
                    folding.add(chunk, item.name, item.sha256, number, rows)
                read += chunk.num_rows
        except InputError as error:
            rejected.append(rejected_for(item.path, item.name, error))
            first = first or str(error)
            continue
        entries.append(RawFileEntry(name=item.name, sha256=item.sha256, rows=read, bytes=item.bytes))
    if rejected:
        raise RawFilesRejected(rejected, first)
    return tuple(entries)


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


def _why_not_incremental(
    previous: Manifest, fingerprints: Sequence[RawFingerprint], schema: TableSchema, rows: int
) -> str | None:
    """Why the previous version cannot be built on, or None when it can."""
    if not schema.accepts(previous.schema):
        return "it was prepared with another table schema"
    if previous.part_rows != rows:
        return f"its parts hold {previous.part_rows} rows each, not {rows}"
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


def with_class_count(schema: TableSchema, folding: Folding, raw: Path) -> TableSchema:
    """`schema` with an open class count fixed from the live rows' labels: for class names, the names found
    (in order of arrival); for class indices, the largest label + 1 of the range the labels fill. A label
    far beyond the others (999999999 among 0..9) is refused naming its file and row: taken as a class
    count, it would make the model's last layer a billion wide. A regression has no classes."""
    if schema.is_regression or (schema.n_classes is not None and schema.label_kind != LABEL_NAME):
        return schema
    if schema.label_kind == LABEL_NAME:
        classes = tuple(folding.classes.values)
        if len(classes) < 2:
            raise InputError(
                f"{escaped(raw)}: the label column {schema.label_column!r} holds only the class "
                f"{escaped(', '.join(classes))}; expected at least two classes (or set objective = "
                '"regression" for a numeric target)'
            )
        if schema.classes is None or len(classes) > len(schema.classes):
            return dataclasses.replace(schema, classes=classes, n_classes=len(classes))
        return schema
    labels = np.array(sorted(folding.labels), dtype=np.int64)
    count = inferred_class_count(labels)
    if labels.max() >= count:
        _refuse_beyond(folding, schema, raw, count)
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


def _refuse_beyond(folding: Folding, schema: TableSchema, raw: Path, count: int) -> None:
    """One line naming the first live row (in file order) whose label is beyond the inferred classes; the
    parts are read one at a time, as this is the refusal's path alone."""
    found: list[tuple[str, int, int]] = []
    for table in _live_tables(folding):
        labels = table.column(schema.label_column).to_numpy()
        beyond = np.flatnonzero(labels >= count)
        files = table.column(SOURCE_FILE_COLUMN).to_numpy(zero_copy_only=False)
        rows = table.column(SOURCE_ROW_COLUMN).to_numpy()
        found += [(str(files[index]), int(rows[index]), int(labels[index])) for index in beyond]
    name, row, value = min(found)
    error = InputError(
        f"{escaped(raw / name)}: data row {row}, column {schema.label_column!r}: expected an "
        f"integer class in [0, {count}), the range the other labels fill, got {value}; if the classes really "
        "go that far, declare them with the task option n_classes (or classes)"
    )
    raise RawFilesRejected([rejected_for(raw / name, name, error)], str(error))


def _live_tables(folding: Folding) -> Iterator[pa.Table]:
    for part in folding.parts:
        for index, entry in enumerate(part.splits):
            with pq.ParquetFile(folding.folder[part.id] / entry.file) as parquet:
                table = parquet.read(use_threads=False)
            keep = np.ones(table.num_rows, dtype=bool)
            keep[folding.dead.get((part.id, index), np.zeros(0, np.int64))] = False
            yield table.filter(pa.array(keep))


def _check_splits(parts: Sequence[Part], unique: int, fractions: SplitFractions, raw: Path) -> None:
    for index, name in enumerate(SPLIT_NAMES):
        if not any(part.splits[index].live_rows for part in parts):
            raise InputError(
                f"{escaped(raw)}: too few rows: {unique} unique rows leave the {name} split empty "
                f"with fractions {_show_fractions(fractions)}; expected more rows (a few dozen at least) "
                "or other --split fractions"
            )


def _show_fractions(fractions: SplitFractions) -> str:
    return ", ".join(f"{name}={value:g}" for name, value in fractions.as_dict().items())
