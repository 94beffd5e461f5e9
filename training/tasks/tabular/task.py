"""The built-in `tabular` task: a classifier over the numeric columns of CSV or Parquet batches.

Its options say which columns are what, so any such table fits, not only the digits sample:

    TabularTask()                                       # the digits sample: row_key, label, pixel_0..63
    TabularTask(label_column="species", key_column=None,
                classes=["setosa", "versicolor", "virginica"])   # an iris CSV, its labels as text

Preparation validates, deduplicates (by the key column, or by a hash of the row when there is none) and
splits by a stable hash of each key, incrementally against the previous version
(training/tasks/tabular/prepare.py). The model is an MLP that carries its own input normalisation
(training/tasks/tabular/model.py); serving takes a DataFrame read straight from a raw CSV.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from core.errors import InputError
from core.metrics import BUILTIN_TASK_METRICS
from training.data.splits import SPLIT_NAMES, SplitFractions
from training.tasks.base import FeatureTable, MetricSet, TaskData
from training.tasks.classification import metrics_from_logits, metrics_from_predictions
from training.tasks.tabular.class_count import raw_class_count
from training.tasks.tabular.dataset import load_prepared
from training.tasks.tabular.dedupe import deduplicate
from training.tasks.tabular.key_sample import KeySample
from training.tasks.tabular.manifest import read_manifest
from training.tasks.tabular.model import ModelConfig, TabularClassifier
from training.tasks.tabular.parts import TRAIN, live_tables, part_rows
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.raw_files import RAW_SUFFIXES, list_raw_files, read_raw_chunks, with_features
from training.tasks.tabular.schema import DIGITS_SCHEMA, TableSchema, feature_matrix

# The options that make the task's schema the digits sample's exactly (the defaults find the same columns
# in the sample's files; these pin them, as a configuration file would).
DIGITS_OPTIONS: dict[str, Any] = {
    "feature_columns": list(DIGITS_SCHEMA.feature_columns),
    "n_classes": DIGITS_SCHEMA.n_classes,
}
DECLARED = BUILTIN_TASK_METRICS["tabular"]  # torch-free, where the front door reads it too
INFO_KEYS = ("n_features", "n_classes", "feature_columns", "feature_mean", "feature_std", "classes")
EXAMPLE_ROWS = 5
SCORE_BATCH = 8192  # rows scored at once: a batch's logits, not the split's
REFERENCE_SPLIT = "train"


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class TabularTask:
    """Classify rows of a table by one integer (or named) label column from numeric feature columns."""

    name = "tabular"
    raw_suffixes: tuple[str, ...] = RAW_SUFFIXES
    metrics: MetricSet = DECLARED.metrics
    default_primary_metric = DECLARED.default_primary_metric

    def __init__(
        self,
        label_column: str = "label",
        key_column: str | None = "row_key",
        feature_columns: list[str] | None = None,
        n_classes: int | None = None,
        classes: list[str] | None = None,
        hidden_width: int = 256,
        hidden_layers: int = 2,
        dropout: float = 0.1,
    ) -> None:
        if not isinstance(label_column, str) or not label_column.strip():
            raise InputError(f"label_column {label_column!r}: expected a column name")
        if key_column is not None and not isinstance(key_column, str):
            raise InputError(f"key_column {key_column!r}: expected a column name, or null for none")
        for option, names in (("feature_columns", feature_columns), ("classes", classes)):
            if names is not None and (isinstance(names, str) or not isinstance(names, list | tuple)):
                raise InputError(f"{option} {names!r}: expected a list of names")
        if not _whole(hidden_width) or hidden_width < 1:
            raise InputError(f"hidden_width {hidden_width!r}: expected a positive integer")
        if not _whole(hidden_layers) or hidden_layers < 1:
            raise InputError(f"hidden_layers {hidden_layers!r}: expected a positive integer")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout < 1.0:
            raise InputError(f"dropout {dropout!r}: expected a probability in [0, 1)")
        self.schema = TableSchema(
            key_column=key_column or None,
            label_column=label_column,
            feature_columns=tuple(feature_columns) if feature_columns is not None else None,
            n_classes=n_classes,
            classes=tuple(classes) if classes is not None else None,
        )
        self._options: dict[str, Any] = {
            "label_column": label_column,
            "key_column": key_column or None,
            "feature_columns": list(feature_columns) if feature_columns is not None else None,
            "n_classes": n_classes,
            "classes": list(classes) if classes is not None else None,
            "hidden_width": hidden_width,
            "hidden_layers": hidden_layers,
            "dropout": float(dropout),
        }

    def options(self) -> Mapping[str, Any]:
        return dict(self._options)

    def class_count(self, raw: Path | None) -> int | None:
        """The classes its per-class recalls cover: the options' (n_classes, or the classes named), else
        the labels in `raw` as preparing would count them; None without either."""
        if self.schema.n_classes is not None:
            return self.schema.n_classes
        return raw_class_count(raw, self.schema.label_column) if raw is not None else None

    # -- data ------------------------------------------------------------------------------------------

    def prepare(self, raw: Path, out: Path, *, previous: Path | None, split: SplitFractions) -> str:
        manifest = prepare(Path(raw), Path(out), previous=previous, schema=self.schema, split=split)
        return manifest.data_version

    def load(self, data_dir: Path) -> TaskData:
        data = load_prepared(Path(data_dir))
        schema = data.schema
        self._check_prepared_with_these_options(schema, Path(data_dir))
        mean, std = data.normalization
        splits = {name: data.split(name).rows for name in SPLIT_NAMES}
        info = {
            "n_features": len(schema.feature_columns or ()),
            "n_classes": schema.n_classes,
            "feature_columns": list(schema.feature_columns or ()),
            "feature_mean": mean.tolist(),
            "feature_std": std.tolist(),
            "classes": list(schema.classes) if schema.classes else None,
            # How the model is served: these columns as integers, the others as decimals (input_example).
            "whole_number_features": data.whole_number_features,
        }
        return TaskData(data_version=data.data_version, splits=splits, info=info)

    def _check_prepared_with_these_options(self, prepared: TableSchema, data_dir: Path) -> None:
        if self.schema.accepts(prepared):
            return
        ours, theirs = self.schema.to_dict(), prepared.to_dict()
        # Open options (feature_columns, n_classes left to the data) accept whatever prepare fixed.
        stated = ["key_column", "label_column", "classes"] + [
            key for key in ("feature_columns", "n_classes") if ours[key] is not None
        ]
        differences = [
            f"{key} {theirs.get(key)!r} (task option: {ours.get(key)!r})"
            for key in stated
            if ours.get(key) != theirs.get(key)
        ]
        raise InputError(
            f"{data_dir}: was prepared with {'; '.join(differences)}; prepare it again with these task "
            "options, or use the options it was prepared with"
        )

    # -- the model -------------------------------------------------------------------------------------

    def build_model(self, info: Mapping[str, Any]) -> nn.Module:
        missing = [key for key in INFO_KEYS if key not in info]
        if missing:
            raise InputError(f"tabular model info lacks {', '.join(missing)}; expected what load() returns")
        config = ModelConfig(
            n_features=int(info["n_features"]),
            n_classes=int(info["n_classes"]),
            hidden_width=self._options["hidden_width"],
            hidden_layers=self._options["hidden_layers"],
            dropout=self._options["dropout"],
        )
        mean = torch.tensor(info["feature_mean"], dtype=torch.float32)
        std = torch.tensor(info["feature_std"], dtype=torch.float32)
        return TabularClassifier(config, mean, std)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        features, labels = batch
        return nn.functional.cross_entropy(model(features), labels)

    def score(self, model: nn.Module, split: Any) -> dict[str, float]:
        """Every metric over the whole split, scored SCORE_BATCH rows at a time: what is held at once is
        one batch's features and logits, and each row's prediction, never the split's features."""
        device = _device_of(model)
        predictions, labels, loss_sum = [], [], 0.0
        with torch.no_grad():
            for start in range(0, max(len(split), 1), SCORE_BATCH):
                features, targets = split[torch.arange(start, min(start + SCORE_BATCH, len(split)))]
                logits, targets = model(features.to(device)), targets.to(device)
                if len(split) <= SCORE_BATCH:  # one batch: the whole split's logits, scored as they are
                    return metrics_from_logits(logits, targets)
                predictions.append(logits.argmax(dim=1))
                labels.append(targets)
                loss_sum += nn.functional.cross_entropy(logits, targets, reduction="sum").item()
        return metrics_from_predictions(torch.cat(predictions), torch.cat(labels), loss_sum / len(split))

    # -- serving ---------------------------------------------------------------------------------------

    def input_example(self, data: TaskData) -> Any:
        import pandas as pd

        columns = list(data.info["feature_columns"])
        test = data.split("test")
        inputs, _ = test[torch.arange(min(EXAMPLE_ROWS, len(test)))]
        example = pd.DataFrame(inputs.double().numpy(), columns=columns)
        # Each column has the type the whole data version gives it, as `pandas.read_csv` reads a raw file
        # of it: int64 where every value is a whole number, float64 otherwise. MLflow infers the serving
        # signature from these types (a few rows alone could make a decimal column look whole).
        return example.astype(dict.fromkeys(data.info["whole_number_features"], "int64"))

    def predict(self, model: nn.Module, info: Mapping[str, Any], inputs: Any) -> Any:
        features = feature_array(inputs, list(info["feature_columns"]))
        with torch.no_grad():
            predicted = model(torch.from_numpy(features).to(_device_of(model))).argmax(dim=1).cpu().numpy()
        classes = info.get("classes")
        if classes:
            return np.asarray(classes, dtype=object)[predicted]
        return predicted.astype(np.int64)

    # -- drift -----------------------------------------------------------------------------------------

    def drift_features(self, source: Path, *, prepared: bool) -> FeatureTable:
        """The train split's live rows, or the raw files' rows deduplicated, as a bounded sample by key
        (training/tasks/tabular/key_sample.py), read one part or chunk at a time."""
        source = Path(source)
        if prepared:
            manifest = read_manifest(source)
            schema, sample = manifest.schema, KeySample(manifest.schema)
            for table in live_tables(source, manifest.parts, TRAIN):
                sample.add(table)
            table = sample.table()
            if table is None or table.num_rows == 0:
                raise InputError(f"{source}: its {REFERENCE_SPLIT} split holds no rows")
        else:
            paths = list_raw_files(source)
            schema = with_features(self.schema, paths)
            sample = KeySample(schema)
            for path in paths:
                for chunk in read_raw_chunks(path, schema, part_rows(schema)):
                    sample.add(chunk)
            table = sample.table()
            if table is None or table.num_rows == 0:
                raise InputError(
                    f"{source}: its {len(paths)} raw file(s) hold no data rows; expected rows under a "
                    f"header of {schema.describe_columns()}"
                )
            table = deduplicate(table, schema).table
        return FeatureTable(tuple(schema.feature_columns or ()), feature_matrix(table, schema))


def feature_array(inputs: Any, feature_columns: list[str]) -> np.ndarray:
    """What a caller has -> float32 [rows, features] in the model's column order.

    A DataFrame (e.g. `pandas.read_csv(raw_file)`) is matched by column name, extra columns (the key, the
    label) ignored; an array or tensor must already hold the features in order."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas comes with MLflow, which serving needs anyway
        pd = None
    if pd is not None and isinstance(inputs, pd.DataFrame):
        missing = [name for name in feature_columns if name not in inputs.columns]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise InputError(
                f"the input lacks feature column(s) {shown}; expected a table with the columns "
                f"{', '.join(feature_columns[:5])}{', ...' if len(feature_columns) > 5 else ''}"
            )
        columns = []
        for name in feature_columns:
            values = pd.to_numeric(inputs[name], errors="coerce").to_numpy(dtype=np.float64)
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                raise InputError(
                    f"input row {int(bad[0]) + 1}, column {name!r}: expected a finite number, "
                    f"got {inputs[name].iloc[int(bad[0])]!r}"
                )
            columns.append(values)
        return np.column_stack(columns).astype(np.float32) if columns else np.zeros((0, 0), np.float32)
    array = inputs.detach().cpu().numpy() if isinstance(inputs, torch.Tensor) else np.asarray(inputs)
    if array.ndim != 2 or array.shape[1] != len(feature_columns):
        raise InputError(
            f"input of shape {array.shape}: expected a DataFrame with the feature columns, or a "
            f"[rows, {len(feature_columns)}] array of features in the order {feature_columns[0]}.."
            f"{feature_columns[-1]}"
        )
    try:
        array = array.astype(np.float32)
    except (TypeError, ValueError) as error:
        raise InputError(f"input array: expected numbers ({error})") from None
    if not np.isfinite(array).all():
        raise InputError("input array: expected finite numbers, found NaN or infinity")
    return array


def _device_of(model: nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")
