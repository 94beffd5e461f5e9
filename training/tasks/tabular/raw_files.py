"""Raw batch files: find them, fingerprint them, and read one into a validated table.

A validated table has the schema's columns with fixed types (key string, label int64, features float64)
plus provenance: `source_file` (the file name) and `source_row` (the 1-based data row in that file).
Reading is vectorized with pyarrow; only when a value does not convert do we search for the first bad
row, so that the error can name it. Features must be finite in float32, the precision training uses: a
value such as 1e308 is finite in float64 but overflows there and would turn the loss into NaN. Everything
a message quotes from the data (file names, column names, cells, pyarrow's reasons) goes through
`escaped` or `repr`, so a control character in a file cannot rewrite the user's terminal.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from core.errors import InputError
from core.files import file_sha256
from core.rejected_inputs import RawFilesRejected, rejected_for
from core.text import escaped
from training.tasks.tabular.encoding import FALSE_TEXT, MISSING_TEXT, TRUE_TEXT
from training.tasks.tabular.schema import (
    BOOLEAN,
    CATEGORICAL,
    DERIVED_KEY_COLUMN,
    LABEL_INDEX,
    LABEL_NAME,
    LABEL_NUMBER,
    NUMERIC,
    SOURCE_FILE_COLUMN,
    SOURCE_ROW_COLUMN,
    TableSchema,
)

log = logging.getLogger(__name__)

RAW_SUFFIXES = (".csv", ".parquet")
_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
_MESSAGE_LIMIT = 200
_DERIVED_KEY_TAG = b"retrain-row/1\n"
_TEXT_TAG = b"retrain-text/1\n"
# float32's largest value is 3.4028235e38; anything past it becomes inf once training casts it.
FINITE_FEATURE = "a finite number within float32's range (|x| <= 3.4e38)"
EXPECTED_UTF8 = "UTF-8 text (save the CSV file as UTF-8)"
_UTF8_CHUNK = 1 << 20
_CSV_BLOCK_BYTES = 4 << 20  # what one CSV read parses at once: bounded, and large enough to read fast
_BATCH_ROWS = 65536  # Parquet rows read at once
_WHOLE_FILE = 1 << 62
_INFERENCE_VALUES = 10_000  # a column's values its type is inferred from


@dataclass(frozen=True)
class RawFingerprint:
    """What identifies a raw file's content without parsing it."""

    path: Path
    sha256: str
    bytes: int

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class _Problem:
    row_index: int
    column_position: int
    column: str
    expected: str
    value: Any


def list_raw_files(raw_dir: Path) -> list[Path]:
    """The raw batch files in `raw_dir`, sorted by name, which is their arrival order.

    Hidden files (a leading '.') are skipped: writers use such names for files still being written.
    """
    expected = "a folder of .csv or .parquet raw batch files"
    if not raw_dir.exists():
        raise InputError(f"{escaped(raw_dir)}: the raw data folder does not exist; expected {expected}")
    if not raw_dir.is_dir():
        raise InputError(f"{escaped(raw_dir)}: is not a folder; expected {expected}")
    candidates = [path for path in raw_dir.iterdir() if path.is_file() and not path.name.startswith(".")]
    files = sorted((path for path in candidates if path.suffix.lower() in RAW_SUFFIXES), key=lambda p: p.name)
    ignored = sorted(path.name for path in candidates if path.suffix.lower() not in RAW_SUFFIXES)
    if ignored:
        log.info(
            "ignoring %d files in %s that are not .csv or .parquet: %s",
            len(ignored), escaped(raw_dir), escaped(ignored),  # file names may hold control characters
        )  # fmt: skip
    if not files:
        raise InputError(f"{escaped(raw_dir)}: holds no raw files; expected {expected} (e.g. batch-0001.csv)")
    return files


def fingerprint(path: Path) -> RawFingerprint:
    return RawFingerprint(path=path, sha256=file_sha256(path), bytes=path.stat().st_size)


def header_columns(path: Path) -> list[str]:
    """The column names of a raw batch file, in file order, without reading its rows."""
    try:
        if path.suffix.lower() == ".parquet":
            return list(pq.read_schema(path).names)
        # utf-8-sig: a BOM (Excel's "CSV UTF-8") is not part of the first column's name; pyarrow drops it too.
        with path.open(newline="", encoding="utf-8-sig") as stream:
            return next(csv.reader(stream), [])
    except UnicodeDecodeError as error:
        raise _not_utf8(path, _first_non_utf8(path)) from error
    except (*_CONVERSION_ERRORS, OSError, csv.Error) as error:
        raise _unreadable(path, error) from error


def with_features(schema: TableSchema, paths: list[Path], previous: TableSchema | None = None) -> TableSchema:
    """`schema` with its open parts fixed: as the `previous` data version has them when it was prepared
    with these options (the model's last good version); else the feature columns as the header of most of
    the raw data (by bytes; then by files; then the earliest name) has them, and each undeclared feature's
    type and the label's kind as the first file of that header shows them (`with_types`). Which file sorts
    first decides nothing of the columns: a file of another header is rejected when it is read, naming
    itself. Raises RawFilesRejected, every file with its reason, when no file has a header with the key,
    the label and features."""
    if not paths:
        return schema
    if previous is not None and previous.is_resolved and schema.accepts(previous):
        return dataclasses.replace(
            schema,
            feature_columns=previous.feature_columns,
            feature_types=previous.feature_types,
            label_kind=previous.label_kind,
        )
    if schema.feature_columns is not None:
        return with_types(schema, next((path for path in paths if path.stat().st_size), paths[0]))
    headers: dict[frozenset[str], _HeaderVote] = {}
    problems = []
    for order, path in enumerate(paths):
        try:
            header = _usable_header(path, schema)
        except InputError as error:
            problems.append(rejected_for(path, path.name, error))
            continue
        vote = headers.setdefault(frozenset(header), _HeaderVote(header, order))
        vote.bytes += path.stat().st_size
        vote.files += 1
    if headers:
        chosen = max(headers.values(), key=lambda vote: (vote.bytes, vote.files, -vote.order))
        return with_types(schema.with_features_from(list(chosen.header)), paths[chosen.order])
    # No file could fix the schema: the first readable header does, so each file's own read says what it
    # lacks against it (as it did before there was a choice to make).
    first: InputError | None = None
    for path in paths:
        try:
            if path.stat().st_size:
                return schema.with_features_from(header_columns(path))
        except InputError as error:
            first = first or error
    raise RawFilesRejected(problems, None if first is None else str(first))


def with_types(schema: TableSchema, path: Path) -> TableSchema:
    """`schema` (its feature columns known) with each feature's type and the label's kind fixed: as the
    options declare them, else as the first block of `path` shows them. A Parquet column's type says it; a
    CSV column of numbers (blanks aside) is numeric, of true/false boolean, of anything else categorical;
    labels that are all whole numbers are class indices, others class names. A file that cannot be read
    leaves the defaults (numeric, class indices): reading it in full then says what is wrong with it."""
    if schema.feature_types is not None and schema.label_kind is not None:
        return schema
    declared = dict(schema.column_types)
    sample: pa.Table | None = None
    try:
        batches = _batches(path, schema)
        next(batches)
        batch = next(batches, None)
        sample = None if batch is None else pa.Table.from_batches([batch])
    except (*_CONVERSION_ERRORS, OSError, UnicodeDecodeError, StopIteration):
        sample = None
    types = []
    for name in schema.feature_columns or ():
        present = sample is not None and name in sample.column_names
        inferred = _inferred_type(sample.column(name)) if present and sample is not None else NUMERIC
        types.append(declared.get(name, inferred))
    kind = schema.label_kind
    if kind is None:
        has_label = sample is not None and schema.label_column in sample.column_names
        kind = _label_kind(sample.column(schema.label_column)) if has_label and sample else LABEL_INDEX
    return dataclasses.replace(schema, feature_types=tuple(types), label_kind=kind)


def _inferred_type(column: pa.ChunkedArray) -> str:
    """A column's type as its values show it. A text column is numeric when most of its values are
    numbers: a typo ("12O") among numbers is then refused naming its row, with the hint to declare the
    column categorical if it really holds names, rather than turning a measurement into a category."""
    if pa.types.is_boolean(column.type):
        return BOOLEAN
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        return NUMERIC
    if not _is_text(column.type):
        return CATEGORICAL  # a date, say: a name the model can learn from, not a number
    present = _blank_as_null(column).drop_null()
    if not len(present):
        return NUMERIC
    lowered = pc.utf8_lower(pc.utf8_trim_whitespace(present))
    if pc.all(pc.is_in(lowered, value_set=pa.array(["false", "true"]))).as_py():
        return BOOLEAN
    return NUMERIC if _mostly(present, _is_number) else CATEGORICAL


def _mostly(values: pa.ChunkedArray, test: Callable[[str], bool]) -> bool:
    """Whether more than half of (the first `_INFERENCE_VALUES` of) `values` pass `test`."""
    sample = values.slice(0, _INFERENCE_VALUES).to_pylist()
    return 2 * sum(1 for value in sample if test(value)) > len(sample)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _label_kind(column: pa.ChunkedArray) -> str:
    """Class indices when most labels are whole numbers of 0 or more (or not text at all), else names: a
    stray "2.5" among indices is refused naming its row."""
    if not _is_text(column.type):
        return LABEL_INDEX
    present = _blank_as_null(column).drop_null()
    if not len(present):
        return LABEL_INDEX
    return LABEL_INDEX if _mostly(present, lambda text: text.strip().isdigit()) else LABEL_NAME


@dataclass
class _HeaderVote:
    """The raw files that share one set of columns: the first one's header, and how much data they hold."""

    header: tuple[str, ...]
    order: int
    bytes: int = 0
    files: int = 0


def _usable_header(path: Path, schema: TableSchema) -> tuple[str, ...]:
    """The file's header, if a schema could be fixed from it: the key and label columns, at least one
    feature column, no column twice; else InputError naming the file."""
    expected = f"expected a header row with {schema.describe_columns()}"
    if path.stat().st_size == 0:
        raise InputError(f"{escaped(path)}: the file is empty (0 bytes); {expected}")
    header = tuple(header_columns(path))
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise InputError(f"{escaped(path)}: repeated column(s) {escaped(', '.join(repeated))}; {expected}")
    missing = [name for name in (schema.key_column, schema.label_column) if name and name not in header]
    if missing:
        raise InputError(f"{escaped(path)}: missing column(s) {escaped(', '.join(missing))}; {expected}")
    if not [name for name in header if name not in (schema.key_column, schema.label_column)]:
        raise InputError(f"{escaped(path)}: no columns besides the key and the label; {expected}")
    return header


def read_raw_file(path: Path, schema: TableSchema) -> pa.Table:
    """Read and validate one whole raw batch file (for a file known to be small; prepare reads in chunks);
    any problem raises an InputError naming file, row, column."""
    chunks = list(read_raw_chunks(path, schema, _WHOLE_FILE))
    return pa.concat_tables(chunks) if chunks else schema.prepared_arrow_schema().empty_table()


def read_raw_chunks(path: Path, schema: TableSchema, rows: int) -> Iterator[pa.Table]:
    """One raw batch file as validated tables of `rows` consecutive data rows each (the last may hold fewer;
    a file of no data rows gives none), read in bounded blocks so a file larger than memory never is held
    whole. A problem raises an InputError naming file, row (counted through the whole file) and column.

    `schema` must know its feature columns (`with_features`); its class count may still be open."""
    if path.stat().st_size == 0:
        raise InputError(
            f"{escaped(path)}: the file is empty (0 bytes); expected a header row with "
            f"{schema.describe_columns()}"
        )
    batches = _batches(path, schema)
    try:
        names = next(batches)
    except (*_CONVERSION_ERRORS, OSError, UnicodeDecodeError) as error:
        raise _parse_error(path, error) from error
    _check_columns(path, names, schema)
    pending: list[pa.RecordBatch] = []
    held = first_row = 0
    while True:
        try:
            batch = next(batches, None)
        except (*_CONVERSION_ERRORS, OSError, UnicodeDecodeError) as error:
            raise _parse_error(path, error) from error
        if batch is not None:
            pending.append(batch)
            held += batch.num_rows
        while held >= rows or (batch is None and held):
            table = pa.Table.from_batches(pending).combine_chunks()
            chunk, rest = table.slice(0, rows), table.slice(rows)
            yield _validated(path, chunk, schema, first_row)
            first_row += chunk.num_rows
            pending, held = rest.to_batches(), rest.num_rows
        if batch is None:
            return


def _batches(path: Path, schema: TableSchema) -> Iterator[Any]:
    """The file's column names, then its record batches in order, each of bounded size."""
    if path.suffix.lower() == ".parquet":
        with pq.ParquetFile(path) as parquet:
            yield list(parquet.schema_arrow.names)
            yield from parquet.iter_batches(batch_size=_BATCH_ROWS, use_threads=False)
        return
    # Read every expected column as text; converting afterwards lets a failure be traced to its row.
    text_columns = {name: pa.string() for name in schema.columns}
    reader = pa_csv.open_csv(
        path,
        read_options=pa_csv.ReadOptions(block_size=_CSV_BLOCK_BYTES, use_threads=False),
        convert_options=pa_csv.ConvertOptions(column_types=text_columns),
    )
    with reader:
        yield list(reader.schema.names)  # pyarrow decodes a header that is not UTF-8 only when asked
        yield from reader


def _parse_error(path: Path, error: Exception) -> InputError:
    # pyarrow reports bytes that are not UTF-8 as a conversion error, or a UnicodeDecodeError when they are
    # in the header; scanning only once parsing failed keeps the common path at one read.
    found = None if path.suffix.lower() == ".parquet" or isinstance(error, OSError) else _first_non_utf8(path)
    return _not_utf8(path, found) if found is not None else _unreadable(path, error)


def _unreadable(path: Path, error: Exception) -> InputError:
    kind = "Parquet" if path.suffix.lower() == ".parquet" else "CSV"
    reason = str(error).splitlines()[0][:_MESSAGE_LIMIT] if str(error) else type(error).__name__
    return InputError(
        f"{escaped(path)}: not a readable {kind} file ({escaped(reason)}); expected a {kind} table"
    )


def _not_utf8(path: Path, found: tuple[int, int] | None) -> InputError:
    where = f"line {found[0]} (byte offset {found[1]})" if found else "a line"
    return InputError(f"{escaped(path)}: {where} is not UTF-8; expected {EXPECTED_UTF8}")


def _first_non_utf8(path: Path) -> tuple[int, int] | None:
    """(1-based line, byte offset) of the first byte that is not UTF-8, or None; read in chunks, so that
    a large file is never held whole."""
    offset, lines, carry = 0, 0, b""
    with path.open("rb") as stream:
        while chunk := stream.read(_UTF8_CHUNK):
            data = carry + chunk
            try:
                data.decode("utf-8")
                good, carry = data, b""
            except UnicodeDecodeError as error:
                if error.end != len(data) or error.reason != "unexpected end of data":
                    return lines + data.count(b"\n", 0, error.start) + 1, offset + error.start
                good, carry = data[: error.start], data[error.start :]  # a character split by the chunk
            lines += good.count(b"\n")
            offset += len(good)
    return (lines + 1, offset) if carry else None


def _check_columns(path: Path, names: list[str], schema: TableSchema) -> None:
    expected = f"expected the columns {schema.describe_columns()}"
    repeated = sorted({name for name in names if names.count(name) > 1})
    missing = [name for name in schema.columns if name not in names]
    unexpected = [name for name in names if name not in schema.columns]
    for problem, found in (("repeated", repeated), ("missing", missing), ("unexpected", unexpected)):
        if found:
            label = "column" if len(found) == 1 else "columns"
            shown = ", ".join(repr(name) for name in found[:5]) + (
                f" and {len(found) - 5} more" if len(found) > 5 else ""
            )
            raise InputError(f"{escaped(path)}: {problem} {label} {shown}; {expected}")


def _validated(path: Path, table: pa.Table, schema: TableSchema, first_row: int = 0) -> pa.Table:
    """`table` (data rows `first_row + 1`.. of the file at `path`) converted and checked."""
    positions = {name: position for position, name in enumerate(table.column_names)}
    converted: dict[str, pa.ChunkedArray] = {}
    problems: list[_Problem] = []
    for name in schema.columns:
        raw = table.column(name)
        target, expected = _target(name, schema)
        if name == schema.label_column and schema.classes and schema.label_kind == LABEL_INDEX:
            values, bad_index = _class_indices(raw, schema)
        elif name == schema.key_column:
            values, bad_index = _convert(raw, target, must_be_text=True)
        elif name == schema.label_column:
            values, bad_index = _convert(_blank_as_null(raw), target, must_be_text=False)
        else:
            values, bad_index = _feature(raw, schema.feature_type(name))
        if values is not None:
            converted[name] = values
            bad_index = _first_invalid(values, name, schema)
        if bad_index is not None:
            problems.append(_Problem(bad_index, positions[name], name, expected, raw[bad_index].as_py()))
    if problems:
        first = min(problems, key=lambda problem: (problem.row_index, problem.column_position))
        raise InputError(
            f"{escaped(path)}: data row {first_row + first.row_index + 1}, column {first.column!r}: expected "
            f"{first.expected}, got {_show(first.value)}"
        )
    if not schema.key_column:
        converted[DERIVED_KEY_COLUMN] = derived_keys(pa.table(converted), schema)
    converted[SOURCE_FILE_COLUMN] = pa.chunked_array([pa.array([path.name] * table.num_rows, pa.string())])
    converted[SOURCE_ROW_COLUMN] = pa.chunked_array(
        [pa.array(np.arange(first_row + 1, first_row + table.num_rows + 1), pa.int64())]
    )
    arrow_schema = schema.prepared_arrow_schema()
    return pa.Table.from_arrays([converted[name] for name in arrow_schema.names], schema=arrow_schema)


def _target(name: str, schema: TableSchema) -> tuple[pa.DataType, str]:
    if name == schema.key_column:
        return pa.string(), "a non-empty string"
    if name == schema.label_column:
        return schema.label_arrow_type(), schema.describe_labels()
    kind = schema.feature_type(name)
    expected = {
        NUMERIC: f"{FINITE_FEATURE} or a blank (if the column holds names, declare it in the task option "
        f'column_types as "categorical")',
        BOOLEAN: "true or false (or 1 or 0), or a blank",
        CATEGORICAL: "a category (text), or a blank",
    }
    return {NUMERIC: pa.float64(), BOOLEAN: pa.bool_(), CATEGORICAL: pa.string()}[kind], expected[kind]


def _blank_as_null(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A text column with pandas' missing-value spellings (`MISSING_TEXT`) as nulls; others as they are."""
    if not _is_text(column.type):
        return column
    text = column.cast(pa.string())
    missing = pc.is_in(text, value_set=pa.array(sorted(MISSING_TEXT), pa.string()))
    return pc.if_else(missing, pa.scalar(None, pa.string()), text)


def _feature(column: pa.ChunkedArray, kind: str) -> tuple[pa.ChunkedArray | None, int | None]:
    """A feature column as its type holds it, a missing value null; or (None, first bad row)."""
    if pa.types.is_floating(column.type):  # Parquet: NaN is a missing value, as pandas reads it
        column = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
    column = _blank_as_null(column)
    if kind == BOOLEAN and _is_text(column.type):
        lowered = pc.utf8_lower(pc.utf8_trim_whitespace(column.cast(pa.string())))
        truth = pc.is_in(lowered, value_set=pa.array(sorted(TRUE_TEXT), pa.string()))
        known = pc.or_(truth, pc.is_in(lowered, value_set=pa.array(sorted(FALSE_TEXT), pa.string())))
        unknown = pc.and_(pc.invert(known), pc.is_valid(lowered)).to_numpy(zero_copy_only=False)
        if unknown.any():
            return None, int(np.flatnonzero(unknown)[0])
        return pc.if_else(pc.is_valid(lowered), truth, pa.scalar(None, pa.bool_())), None
    target = {NUMERIC: pa.float64(), BOOLEAN: pa.bool_(), CATEGORICAL: pa.string()}[kind]
    return _convert(column, target, must_be_text=False)


def derived_keys(table: pa.Table, schema: TableSchema) -> pa.ChunkedArray:
    """Each row's key in a table without a key column: its row digest (`row_digests`) in hex, which exact
    duplicates share."""
    return pa.chunked_array([pa.array([digest.hex() for digest in row_digests(table, schema)], pa.string())])


def row_digests(table: pa.Table, schema: TableSchema) -> np.ndarray:
    """16 bytes per row (`S16`), a hash of its label and feature values as validated (so `1` and `1.0`, and
    -0.0 and 0.0, are the same row; a missing value is one value): equal rows, and only they, share one.

    Numbers (and booleans) enter as float64, a missing one as one NaN; text (a category, a class name) as
    8 bytes of its own hash, so each row hashes a fixed width, whatever its text."""
    label = table.column(schema.label_column)
    parts = [_text_bytes(label) if pa.types.is_string(label.type) else _number_bytes(label)]
    for name in schema.feature_columns or ():
        column = table.column(name)
        parts.append(
            _text_bytes(column) if schema.feature_type(name) == CATEGORICAL else _number_bytes(column)
        )
    rows = np.concatenate(parts, axis=1) if table.num_rows else np.zeros((0, 0), np.uint8)
    tagged = hashlib.sha256(_DERIVED_KEY_TAG)
    digests = []
    for row in rows:
        digest = tagged.copy()
        digest.update(row.tobytes())
        digests.append(digest.digest()[:16])
    return np.array(digests, dtype="S16")


def _number_bytes(column: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_integer(column.type):  # a class index: its own 8 bytes, as the label always entered
        values = np.ascontiguousarray(column.to_numpy(), dtype="<i8")
    else:
        if pa.types.is_boolean(column.type):
            column = column.cast(pa.float64())
        numbers = column.to_numpy(zero_copy_only=False).astype(np.float64) + 0.0
        values = np.ascontiguousarray(np.where(np.isnan(numbers), np.nan, numbers), dtype="<f8")
    return values.view(np.uint8).reshape(-1, 8)


def _text_bytes(column: pa.ChunkedArray) -> np.ndarray:
    encoded = column.combine_chunks().dictionary_encode()
    words = [
        hashlib.sha256(_TEXT_TAG + value.encode()).digest()[:8] for value in encoded.dictionary.to_pylist()
    ]
    table = np.array([*words, b"\0" * 8], dtype="S8")  # the last: a missing value
    indices = encoded.indices.fill_null(len(words)).to_numpy(zero_copy_only=False)
    return table[indices].view(np.uint8).reshape(-1, 8)


def _class_indices(column: pa.ChunkedArray, schema: TableSchema) -> tuple[pa.ChunkedArray | None, int | None]:
    """Class names (or indices written as text) -> class indices; (None, first bad row) otherwise."""
    names = list(schema.classes or ())
    spellings = names + [str(index) for index in range(len(names)) if str(index) not in names]
    index_of = np.array([*range(len(names)), *(int(text) for text in spellings[len(names) :])], np.int64)
    try:
        text = pc.utf8_trim_whitespace(pc.cast(column, pa.string()))
    except _CONVERSION_ERRORS:
        return None, 0
    positions = pc.index_in(text, value_set=pa.array(spellings, pa.string()))
    missing = np.flatnonzero(positions.is_null().to_numpy(zero_copy_only=False))
    if missing.size:
        return None, int(missing[0])
    found = positions.to_numpy(zero_copy_only=False).astype(np.int64)
    return pa.chunked_array([pa.array(index_of[found], pa.int64())]), None


def _convert(
    column: pa.ChunkedArray, target: pa.DataType, *, must_be_text: bool
) -> tuple[pa.ChunkedArray | None, int | None]:
    """`column` cast to `target`, or (None, index of the first value that does not convert)."""
    if must_be_text and not _is_text(column.type) and len(column) > 0:
        return None, 0
    try:
        return pc.cast(column, target), None
    except _CONVERSION_ERRORS:
        return None, _first_unconvertible(column, target)


def _is_text(data_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    return pa.types.is_string(data_type) or pa.types.is_large_string(data_type)


def _first_unconvertible(column: pa.ChunkedArray, target: pa.DataType) -> int:
    """Bisect on prefixes: the cast kernel itself decides, so the slow path agrees with the fast one."""
    low, high = 0, len(column)  # the prefix of length `high` fails to convert, `low` converts
    while high - low > 1:
        middle = (low + high) // 2
        try:
            pc.cast(column.slice(0, middle), target)
            low = middle
        except _CONVERSION_ERRORS:
            high = middle
    return high - 1 if high > 0 else 0


def _first_invalid(values: pa.ChunkedArray, name: str, schema: TableSchema) -> int | None:
    """Index of the first converted value that is null or outside the column's allowed values."""
    if name not in (schema.key_column, schema.label_column):  # a feature: missing is allowed
        if schema.feature_type(name) != NUMERIC:
            return None
        numbers = values.fill_null(0.0).to_numpy()
        with np.errstate(over="ignore"):  # overflowing float32 is what is being looked for
            bad_numbers = np.flatnonzero(~np.isfinite(numbers.astype(np.float32)))
        return int(bad_numbers[0]) if bad_numbers.size else None
    bad = values.is_null().to_numpy(zero_copy_only=False)
    if name == schema.key_column:
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(values)), 0)
        bad |= blank.fill_null(False).to_numpy(zero_copy_only=False)
    elif schema.label_kind == LABEL_NUMBER:
        with np.errstate(over="ignore"):
            bad |= ~np.isfinite(values.fill_null(0.0).to_numpy().astype(np.float32))
    elif schema.label_kind == LABEL_NAME:
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(values)), 0)
        bad |= blank.fill_null(False).to_numpy(zero_copy_only=False)
    else:
        labels = values.fill_null(0).to_numpy()
        bad |= labels < 0
        if schema.n_classes is not None:
            bad |= labels >= schema.n_classes
    indices = np.flatnonzero(bad)
    return int(indices[0]) if indices.size else None


def _show(value: Any) -> str:
    if value is None:
        return "an empty value"
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
