"""The built-in `tabular` task: a classifier or regressor over the tables people have, from CSV or Parquet
batches: numeric, categorical (text) and boolean columns, with missing values in any of them.

Its options say which columns are what, so any such table fits, not only the digits sample:

    TabularTask()                                       # the digits sample: row_key, label, pixel_0..63
    TabularTask(label_column="species", key_column=None,
                classes=["setosa", "versicolor", "virginica"])   # an iris CSV, its labels as text
    TabularTask(label_column="churned", key_column="customer_id",
                column_types={"plan": "categorical"}, class_weights="balanced")
    TabularTask(label_column="price", objective="regression")

A feature's type is declared in `column_types` or inferred from the first raw file, and recorded in the
data version's manifest with each categorical column's vocabulary. Preparation validates, deduplicates (by
the key column, or by a hash of the row when there is none) and splits by a stable hash of each key,
incrementally against the previous version (training/tasks/tabular/prepare.py). The model
(training/tasks/tabular/model.py) carries its normalisation and embeddings, and its `info` the
vocabularies, so serving takes a DataFrame read straight from a raw CSV and needs no training data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from core.errors import InputError
from core.metrics import BUILTIN_TASK_METRICS, builtin_declared
from core.text import escaped
from training.data.splits import SPLIT_NAMES, SplitFractions
from training.data.token_shares import TokenGroup
from training.tasks.base import FeatureTable, MetricSet, TaskData
from training.tasks.classification import metrics_from_logits, metrics_from_predictions
from training.tasks.tabular.class_count import raw_class_count
from training.tasks.tabular.dataset import PreparedData, load_prepared
from training.tasks.tabular.dedupe import deduplicate
from training.tasks.tabular.inputs import feature_array
from training.tasks.tabular.key_sample import KeySample
from training.tasks.tabular.manifest import read_manifest
from training.tasks.tabular.model import ModelConfig, TabularModel
from training.tasks.tabular.parts import TRAIN, live_tables, part_rows
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.raw_files import RAW_SUFFIXES, list_raw_files, read_raw_chunks, with_features
from training.tasks.tabular.schema import (
    CATEGORICAL,
    CLASSIFICATION,
    DEFAULT_MAX_CATEGORIES,
    DIGITS_SCHEMA,
    NUMERIC,
    REGRESSION,
    TableSchema,
    numeric_matrix,
)

# The options that make the task's schema the digits sample's exactly (the defaults find the same columns
# in the sample's files; these pin them, as a configuration file would).
DIGITS_OPTIONS: dict[str, Any] = {
    "feature_columns": list(DIGITS_SCHEMA.feature_columns or ()),
    "n_classes": DIGITS_SCHEMA.n_classes,
}
DECLARED = BUILTIN_TASK_METRICS["tabular"]  # torch-free, where the front door reads it too
# What build_model needs of `info`; a model trained before categories (no feature_types) is all numeric.
INFO_KEYS = ("n_features", "n_classes", "feature_columns", "feature_mean", "feature_std", "classes")
EXAMPLE_ROWS = 5
SCORE_BATCH = 8192  # rows scored at once: a batch's outputs, not the split's
REFERENCE_SPLIT = "train"
BALANCED = "balanced"
MISSING_CATEGORY = "(missing)"  # a drift token: the share of rows without a category is compared too


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class TabularTask:
    """Predict one label column of a table (a class, or a number) from its other columns."""

    name = "tabular"
    raw_suffixes: tuple[str, ...] = RAW_SUFFIXES

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
        objective: str = CLASSIFICATION,
        column_types: Mapping[str, str] | None = None,
        class_weights: str | Mapping[str, float] | None = None,
        max_categories: int = DEFAULT_MAX_CATEGORIES,
    ) -> None:
        if not isinstance(label_column, str) or not label_column.strip():
            raise InputError(f"label_column {label_column!r}: expected a column name")
        if key_column is not None and not isinstance(key_column, str):
            raise InputError(f"key_column {key_column!r}: expected a column name, or null for none")
        for option, names in (("feature_columns", feature_columns), ("classes", classes)):
            if names is not None and (isinstance(names, str) or not isinstance(names, list | tuple)):
                raise InputError(f"{option} {names!r}: expected a list of names")
        if column_types is not None and not isinstance(column_types, Mapping):
            raise InputError(
                f"column_types {column_types!r}: expected a table of column = type, e.g. "
                '{ city = "categorical" }'
            )
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
            objective=objective,
            column_types=tuple((column_types or {}).items()),
            max_categories=max_categories,
        )
        self.class_weights = _class_weights_option(class_weights, self.schema)
        declared = builtin_declared(self.name, {"objective": objective}) or DECLARED
        self.metrics: MetricSet = declared.metrics
        self.default_primary_metric = declared.default_primary_metric
        self._example: Any = None
        self._loaded_info: Mapping[str, Any] = {}
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
        # The newer options only where set: a model's recorded options (and their hash) stay as they were.
        newer = {
            "objective": (objective, CLASSIFICATION),
            "column_types": (dict(column_types) if column_types else None, None),
            "class_weights": (
                dict(class_weights) if isinstance(class_weights, Mapping) else class_weights,
                None,
            ),
            "max_categories": (max_categories, DEFAULT_MAX_CATEGORIES),
        }
        self._options.update({key: value for key, (value, default) in newer.items() if value != default})

    def options(self) -> Mapping[str, Any]:
        return dict(self._options)

    def class_count(self, raw: Path | None) -> int | None:
        """The classes its per-class recalls cover: the options' (n_classes, or the classes named), else
        the labels in `raw` as preparing would count them; None without either (and for a regression)."""
        if self.schema.is_regression:
            return None
        if self.schema.n_classes is not None:
            return self.schema.n_classes
        return raw_class_count(raw, self.schema.label_column) if raw is not None else None

    # -- data ------------------------------------------------------------------------------------------

    def prepare(self, raw: Path, out: Path, *, previous: Path | None, split: SplitFractions) -> str:
        manifest = prepare(Path(raw), Path(out), previous=previous, schema=self.schema, split=split)
        return manifest.data_version

    def load(self, data_dir: Path) -> TaskData:
        data = load_prepared(Path(data_dir))
        manifest, schema = data.manifest, data.schema
        self._check_prepared_with_these_options(schema, Path(data_dir))
        mean, std = data.normalization
        splits = {name: data.split(name).rows for name in SPLIT_NAMES}
        categorical = schema.columns_of(CATEGORICAL)
        info = {
            "objective": schema.objective,
            "n_features": len(schema.feature_columns or ()),
            "n_classes": schema.n_classes,
            "feature_columns": list(schema.feature_columns or ()),
            "feature_types": list(schema.feature_types or ()),
            "feature_mean": mean.tolist(),
            "feature_std": std.tolist(),
            "classes": list(schema.classes) if schema.classes else None,
            "vocabularies": {name: list(manifest.vocabularies.get(name, ())) for name in categorical},
            "category_counts": [list(counts) for counts in manifest.totals.categories],
            "target": list(manifest.totals.target_mean_std()) if schema.is_regression else None,
            # How the model is served: these columns as integers, the others as decimals (input_example).
            "whole_number_features": data.whole_number_features,
            "missing_values": sum(manifest.totals.missing) > 0,
            "missing_counts": list(manifest.totals.missing),
        }
        weights = self.class_weights
        if weights == BALANCED:
            weights = _balanced(manifest.totals.labels, schema.n_classes or 0)
        elif isinstance(weights, Mapping):
            weights = _named_weights(weights, schema)
        info["class_weights"] = weights
        self._loaded_info = info
        self._example = _example_rows(data, info)
        return TaskData(data_version=data.data_version, splits=splits, info=info)

    def _check_prepared_with_these_options(self, prepared: TableSchema, data_dir: Path) -> None:
        if self.schema.accepts(prepared):
            return
        ours, theirs = self.schema.to_dict(), prepared.to_dict()
        # Open options (feature_columns, n_classes left to the data) accept whatever prepare fixed.
        stated = ["key_column", "label_column", "objective", "max_categories"] + [
            key
            for key in ("feature_columns", "n_classes", "classes", "label_kind", "column_types")
            if ours[key] not in (None, {})
        ]
        differences = [
            f"{key} {theirs.get(key)!r} (task option: {ours.get(key)!r})"
            for key in stated
            if ours.get(key) != theirs.get(key)
        ]
        raise InputError(
            f"{data_dir}: was prepared with {'; '.join(differences) or 'other column types'}; prepare it "
            "again with these task options, or use the options it was prepared with"
        )

    # -- the model -------------------------------------------------------------------------------------

    def build_model(self, info: Mapping[str, Any]) -> nn.Module:
        missing = [key for key in INFO_KEYS if key not in info]
        if missing:
            raise InputError(f"tabular model info lacks {', '.join(missing)}; expected what load() returns")
        regression = info.get("objective", CLASSIFICATION) == REGRESSION
        config = ModelConfig(
            n_features=int(info["n_features"]),
            n_classes=1 if regression else int(info["n_classes"]),
            hidden_width=self._options["hidden_width"],
            hidden_layers=self._options["hidden_layers"],
            dropout=self._options["dropout"],
        )
        types = list(info.get("feature_types") or [NUMERIC] * int(info["n_features"]))
        categorical = [position for position, kind in enumerate(types) if kind == CATEGORICAL]
        target = info.get("target")
        return TabularModel(
            config,
            torch.tensor(info["feature_mean"], dtype=torch.float32),
            torch.tensor(info["feature_std"], dtype=torch.float32),
            categorical=categorical,
            categories=list(info.get("category_counts") or []),
            target=(float(target[0]), float(target[1])) if regression and target else None,
            indicated=[position for position, count in enumerate(info.get("missing_counts") or []) if count],
        )

    def loss(self, model: nn.Module, batch: Any, info: Mapping[str, Any] | None = None) -> torch.Tensor:
        """Cross-entropy (weighted by `class_weights`), or a regression's squared error in units of the
        target's train std, so that its scale does not set the learning rate's. `info` is the loaded data
        version's; a subclass calling `super().loss(model, batch)` gets the one its `load` returned."""
        features, targets = batch
        output = model(features)
        info = info if info is not None else self._loaded_info
        if self.schema.is_regression:
            target = info.get("target")
            scale = float(target[1]) if target and target[1] else 1.0
            return nn.functional.mse_loss(output / scale, targets.to(output.dtype) / scale)
        weights = info.get("class_weights")
        weight = None if weights is None else torch.tensor(weights, dtype=output.dtype, device=output.device)
        return nn.functional.cross_entropy(output, targets, weight=weight)

    def score(self, model: nn.Module, split: Any) -> dict[str, float]:
        """Every metric over the whole split, scored SCORE_BATCH rows at a time: what is held at once is
        one batch's features and outputs, and each row's prediction, never the split's features."""
        device = _device_of(model)
        if self.schema.is_regression:
            return _regression_metrics(model, split, device)
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
        """A few test rows as a raw file of the data reads with `pandas.read_csv`: numbers as int64 where
        the whole data version holds whole numbers there, float64 otherwise; categories as text; booleans
        as bool (object with a missing value)."""
        if self._example is None:
            raise InputError("input_example needs the data loaded by this task first (task.load)")
        return self._example

    def typed_inputs(self, info: Mapping[str, Any]) -> bool:
        """Whether MLflow may check served inputs by column type: only for a table of numbers with no
        missing value. Elsewhere a column's type varies by file (a blank turns read_csv's int64 column to
        float64; a column of blanks reads as numbers), which MLflow's schema cannot express, so the
        model's own reading (inputs.py) checks names and values."""
        types = info.get("feature_types") or []
        return all(kind == NUMERIC for kind in types) and not info.get("missing_values", False)

    def predict(self, model: nn.Module, info: Mapping[str, Any], inputs: Any) -> Any:
        features = feature_array(inputs, info)
        with torch.no_grad():
            output = model(torch.from_numpy(features).to(_device_of(model))).cpu()
        if info.get("objective") == REGRESSION:
            return output.numpy().astype(np.float64)
        predicted = output.argmax(dim=1).numpy()
        classes = info.get("classes")
        if classes:
            return np.asarray(classes, dtype=object)[predicted]
        return predicted.astype(np.int64)

    # -- drift -----------------------------------------------------------------------------------------

    def drift_features(self, source: Path, *, prepared: bool) -> FeatureTable:
        """The train split's live rows, or the raw files' rows deduplicated, as a bounded sample by key
        (training/tasks/tabular/key_sample.py), read one part or chunk at a time: numbers (a boolean as
        1 or 0, a missing value NaN, which the drift check compares as a missing share) and each
        categorical column's category shares (a missing one as the category `(missing)`)."""
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
        numbers = tuple(
            name for name in schema.feature_columns or () if schema.feature_type(name) != CATEGORICAL
        )
        groups = tuple(
            TokenGroup(
                name,
                tuple(
                    (MISSING_CATEGORY if value is None else value,)
                    for value in table.column(name).to_pylist()
                ),
            )
            for name in schema.columns_of(CATEGORICAL)
        )
        return FeatureTable(numbers, numeric_matrix(table, numbers), groups)


def _class_weights_option(
    weights: str | Mapping[str, float] | None, schema: TableSchema
) -> str | dict[str, float] | None:
    expected = 'expected "balanced", or a table of class = weight (a positive number), e.g. { yes = 3.0 }'
    if weights is None:
        return None
    if schema.is_regression:
        raise InputError("class_weights: a regression has no classes; leave class_weights out")
    if weights == BALANCED:
        return BALANCED
    if not isinstance(weights, Mapping) or not weights:
        raise InputError(f"class_weights {weights!r}: {expected}")
    for name, weight in weights.items():
        number = weight if isinstance(weight, int | float) and not isinstance(weight, bool) else None
        if number is None or not math.isfinite(number) or number <= 0:
            raise InputError(f"class_weights {name} = {weight!r}: {expected}")
    return {str(name): float(weight) for name, weight in weights.items()}


def _balanced(labels: Sequence[tuple[int, int]], n_classes: int) -> list[float]:
    """Each class's weight inversely proportional to its rows (scikit-learn's "balanced"): rows /
    (classes x the class's rows); a class with no rows weighs 1."""
    counts = np.zeros(n_classes)
    for label, count in labels:
        if 0 <= label < n_classes:
            counts[label] = count
    present = counts > 0
    weights = np.ones(n_classes)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return [float(weight) for weight in weights]


def _named_weights(weights: Mapping[str, float], schema: TableSchema) -> list[float]:
    """A weight per class index from weights by class name (or index); a class not named weighs 1."""
    names = list(schema.classes or ()) or [str(index) for index in range(schema.n_classes or 0)]
    unknown = [name for name in weights if name not in names]
    if unknown:
        raise InputError(
            f"class_weights names {escaped(', '.join(unknown))}, which are not classes of the data; expected "
            f"some of {escaped(', '.join(names[:10]))}"
        )
    return [float(weights.get(name, 1.0)) for name in names]


def _example_rows(data: PreparedData, info: Mapping[str, Any]) -> Any:
    """The first rows of the test split as a DataFrame, typed as `pandas.read_csv` reads a raw file."""
    import pandas as pd

    schema = data.schema
    columns = list(schema.feature_columns or ())
    test = SPLIT_NAMES.index("test")
    rows: list[pa.Table] = []
    held = 0
    for table in live_tables(data.data_dir, data.manifest.parts, test):
        rows.append(table.select(columns).slice(0, EXAMPLE_ROWS - held))
        held += rows[-1].num_rows
        if held >= EXAMPLE_ROWS:
            break
    frame = pa.concat_tables(rows).to_pandas() if rows else pd.DataFrame(columns=columns)
    # MLflow infers the serving signature from these types; a few rows alone could make a decimal column
    # look whole, so the whole data version decides.
    whole = [name for name in info["whole_number_features"] if not frame[name].isna().any()]
    return frame.astype(dict.fromkeys(whole, "int64"))


def _regression_metrics(model: nn.Module, split: Any, device: torch.device) -> dict[str, float]:
    """rmse, mae, r2 and the loss (mean squared error) over the split, in batches: running sums only."""
    count, absolute, squared, total, total_squares = 0, 0.0, 0.0, 0.0, 0.0
    with torch.no_grad():
        for start in range(0, len(split), SCORE_BATCH):
            features, targets = split[torch.arange(start, min(start + SCORE_BATCH, len(split)))]
            predicted = model(features.to(device)).double().cpu()
            targets = targets.double()
            error = predicted - targets
            count += len(targets)
            absolute += error.abs().sum().item()
            squared += (error * error).sum().item()
            total += targets.sum().item()
            total_squares += (targets * targets).sum().item()
    count = max(count, 1)
    variance = total_squares / count - (total / count) ** 2
    return {
        "rmse": math.sqrt(squared / count),
        "mae": absolute / count,
        "r2": 1.0 - (squared / count) / variance if variance > 0 else math.nan,
        "loss": squared / count,
    }


def _device_of(model: nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")
