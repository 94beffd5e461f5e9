"""How many classes a tabular task's raw data holds, read before anything is prepared.

The pre-run check asks it when a gate policy or an early-stopping metric names one class's recall
(`recall_99`) and the task's options do not fix the class count: preparing would fix it from the labels
(prepare.py `with_class_count`), and a member beyond it is one the candidate can never report. Only the
label column is read. A file that cannot be read, or whose labels are not class indices, is left to the
prepare step, which refuses it naming the file; what is counted here is then a superset of what it
prepares, so the count is never below the prepared one, and a member is never refused that the data could
report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from core.errors import InputError
from training.tasks.tabular.prepare import inferred_class_count
from training.tasks.tabular.raw_files import list_raw_files

_READ_ERRORS = (pa.ArrowException, OSError, UnicodeDecodeError, ValueError)


def raw_class_count(raw: Path, label_column: str) -> int | None:
    """The class count the labels in `raw`'s files imply, as prepare infers it; None when no file has
    labels that are class indices (prepare then says why)."""
    try:
        paths = list_raw_files(Path(raw))
    except InputError:
        return None
    labels = [found for path in paths if (found := _labels(path, label_column)) is not None]
    if not labels:
        return None
    count = inferred_class_count(np.concatenate(labels))
    return count if count >= 1 else None


def _labels(path: Path, label_column: str) -> np.ndarray | None:
    """The file's labels as integers >= 0, or None when it has none such (unreadable, no such column,
    a label that is not a class index, or a missing one)."""
    try:
        if path.suffix.lower() == ".parquet":
            table = pq.read_table(path, columns=[label_column])
        else:
            options = pa_csv.ConvertOptions(include_columns=[label_column])
            table = pa_csv.read_csv(path, convert_options=options)
        column = table.column(label_column)
        if column.null_count or not pa.types.is_integer(column.type):
            return None
        values = pc.cast(column, pa.int64()).to_numpy()
    except (*_READ_ERRORS, KeyError):
        return None
    # Only which labels occur decides the count: a file's distinct labels, so the files' labels are never
    # held together, however many rows they have.
    return np.unique(values) if values.size and int(values.min()) >= 0 else None
