"""`retrain init`: a commented configuration that loads as it is, showing every key the loader accepts; for
`custom` a task file that runs as it is on the sample data it generates, and for `tabular` no code but a
sample table to train on."""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from components.errors import ConfigError
from components.local import cli as local_cli
from components.local.model_init import KINDS, TEMPLATES, class_name, init_model, render_config
from components.local.sample_table import (
    CLASSES,
    COLUMN_TYPES,
    COLUMNS,
    KEY_COLUMN,
    LABEL_COLUMN,
    SAMPLE_FILE,
    SAMPLE_ROWS,
    sample_csv,
)
from components.model_config import _TASK_KEYS, _TRIGGER_KEYS, MODELS_DIR_VARIABLE, load_model_config
from components.parameters import _overridable_inputs
from components.run_inputs import GATE_INPUTS
from components.specs import REPO_ROOT, load_pipeline_spec


def retrain_init(cwd: Path, *argv: str, environ: dict[str, str] | None = None) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="retrain")
    local_cli.register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["init", *argv])
    args.state_root, args.environ = cwd / "state", environ or {}
    out = io.StringIO()
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        return args.handler(args, out), out.getvalue()
    finally:
        os.chdir(previous)


@pytest.mark.parametrize(("kind", "task"), [("tabular", "tabular"), ("image", "image")])
def test_a_built_in_task_s_configuration_loads_as_written(tmp_path, kind, task):
    code, output = retrain_init(tmp_path, "flowers", "--task", kind)

    path = tmp_path / "models" / "flowers.toml"
    assert (code, output.splitlines()[0]) == (0, f"wrote {path}")
    config = load_model_config(path)
    assert (config.name, config.task.text, config.trigger.prefix) == ("flowers", task, "flowers")
    assert config.gate.primary_metric == "macro_f1"
    assert unexplained_keys(path.read_text()) == []


def unexplained_keys(text: str) -> list[str]:
    """Keys (set, or shown commented out) with neither a comment after them nor a comment line above."""
    lines = text.splitlines()
    keys = []
    for above, line in zip(["", *lines], lines, strict=False):
        key, equals, value = line.lstrip("# ").partition(" = ")
        if equals and key.replace("_", "").isalnum() and "#" not in value and not above.startswith("#"):
            keys.append(key)
    return keys


def test_custom_writes_a_configuration_naming_its_task_file(tmp_path):
    code, output = retrain_init(tmp_path, "house-prices", "--task", "custom")

    task_file = tmp_path / "models" / "house-prices_task.py"
    assert code == 0
    assert f"  {shlex.quote(sys.executable)} models/{task_file.name} --sample RAW" in output.splitlines()
    config = load_model_config(tmp_path / "models" / "house-prices.toml")
    assert config.task.text == f"{task_file}:HousePricesTask"
    assert (config.gate.primary_metric, config.gate.min_improvement) == ("mse", 0.0)
    assert f"python models/{task_file.name} --sample RAW" in task_file.read_text()
    assert unexplained_keys((tmp_path / "models" / "house-prices.toml").read_text()) == []


def printed_commands(output: str) -> list[list[str]]:
    """The command lines init prints, one an indented line, as a shell splits them."""
    return [shlex.split(line) for line in output.splitlines() if line.startswith("  ")]


def _as_a_users_shell() -> dict[str, str]:
    """As a user's shell runs a printed line: no activated environment (only the system's folders on PATH)
    and no configuration folder set. PYTHONPATH names this checkout, as the editable install does for a
    user's."""
    return {
        **{name: value for name, value in os.environ.items() if not name.startswith(("RETRAIN_", "MLFLOW_"))},
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO_ROOT),
    }


def _run_as_printed(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=_as_a_users_shell(), capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{shlex.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done


RETRAIN_SCRIPT = str(Path(sys.executable).parent / "retrain")  # the script beside this interpreter, by path


def test_the_printed_commands_run_as_printed_from_the_folder_init_ran_in(tmp_path):
    """The custom kind's lines, run as printed: the task file writes its sample data, and one `retrain run`
    prepares, trains, evaluates and registers with the task file init wrote."""
    code, output = retrain_init(tmp_path, "trial", "--task", "custom")
    sample, run = printed_commands(output)

    assert code == 0 and sample[0] == sys.executable
    assert run == [RETRAIN_SCRIPT, "run", "--model-name", "trial", "--data", "RAW"]
    _run_as_printed(sample, tmp_path)
    done = _run_as_printed(run, tmp_path)
    assert any(line.startswith("run ") and ": Completed" in line for line in done.stdout.splitlines())
    assert (tmp_path / ".retrain" / "runs").is_dir()  # the run's state went where the user is, by default


def test_the_image_kind_prints_sample_data_that_runs_and_the_same_run_line(tmp_path):
    """The run line is the custom kind's, whose whole pipeline the test above runs as printed; here the
    image kind's sample-data line runs as printed and writes what the run line's RAW names."""
    code, output = retrain_init(tmp_path, "trial", "--task", "image")
    sample, run = printed_commands(output)

    assert code == 0 and sample[:2] == [RETRAIN_SCRIPT, "sample-data"]
    assert run == [RETRAIN_SCRIPT, "run", "--model-name", "trial", "--data", "RAW"]
    _run_as_printed(sample, tmp_path)
    assert any((tmp_path / "RAW").iterdir())


def test_a_model_written_elsewhere_is_run_by_its_file(tmp_path):
    code, output = retrain_init(tmp_path, "b", "--task", "tabular", "--dir", str(tmp_path / "elsewhere"))
    assert code == 0
    assert printed_commands(output)[-1][1:] == ["run", "--config", "elsewhere/b.toml", "--data", "landing/b"]


def test_the_folder_comes_from_the_setting_or_the_option(tmp_path):
    retrain_init(tmp_path, "a", "--task", "tabular", environ={MODELS_DIR_VARIABLE: "conf"})
    retrain_init(tmp_path, "b", "--task", "tabular", "--dir", "elsewhere")
    assert (tmp_path / "conf" / "a.toml").is_file() and (tmp_path / "elsewhere" / "b.toml").is_file()


def test_nothing_is_overwritten(tmp_path):
    init_model("house", "custom", tmp_path)
    (tmp_path / "house.toml").unlink()  # the task file alone is still there
    with pytest.raises(ConfigError, match=r"house_task.py: exists already; expected a new model name"):
        init_model("house", "custom", tmp_path)
    assert not (tmp_path / "house.toml").exists()
    init_model("flat", "tabular", tmp_path)
    before = (tmp_path / "flat.toml").read_text()
    with pytest.raises(ConfigError, match=r"flat.toml: exists already"):
        init_model("flat", "image", tmp_path)
    assert (tmp_path / "flat.toml").read_text() == before


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("House", "tabular", r"model name 'House': expected 1-40"),
        ("house", "rnn", r"--task 'rnn': expected one"),
    ],
)
def test_bad_names_and_kinds_are_refused(tmp_path, name, kind, message):
    with pytest.raises(Exception, match=message):
        init_model(name, kind, tmp_path)
    assert not tmp_path.joinpath("models").exists()


def test_class_names_follow_the_model_name():
    assert (class_name("house-prices"), class_name("digits"), class_name("a-b_c")) == (
        "HousePricesTask", "DigitsTask", "ABCTask"
    )  # fmt: skip


# -- every key the loader accepts, shown; every one shown, accepted -----------------------------------------

_TABLE = re.compile(r"\[(?P<table>[a-z.]+)\]")
_SHOWN_KEY = re.compile(r"(?P<mark># )?(?P<key>[A-Za-z_][A-Za-z0-9_]*) = ")


def shown_keys(text: str) -> dict[str, dict[str, bool]]:
    """Each table's keys as the file shows them ("" the top level), each with whether it is set (False: a
    commented-out `# key = value` line)."""
    tables: dict[str, dict[str, bool]] = {"": {}}
    table = ""
    for line in text.splitlines():
        if header := _TABLE.fullmatch(line):
            table = header["table"]
            tables.setdefault(table, {})
        elif shown := _SHOWN_KEY.match(line):
            tables[table][shown["key"]] = not shown["mark"]
    return tables


def accepted_keys() -> dict[str, set[str]]:
    """The keys model_config.load_model_config accepts, table by table (task options are the task's)."""
    pipeline = _overridable_inputs(load_pipeline_spec()) - set(GATE_INPUTS)
    return {
        "": {"name"},
        "task": set(_TASK_KEYS) - {"options"},
        "gate": set(GATE_INPUTS),
        "pipeline": pipeline,
        "trigger": set(_TRIGGER_KEYS),
    }


def rendered(kind: str) -> str:
    return render_config("trial", kind, "trial_task.py" if kind == "custom" else None)


@pytest.mark.parametrize("kind", KINDS)
def test_the_configuration_shows_every_key_the_loader_accepts(kind):
    """Set or commented out: a key the loader gains (a new train input) fails here until the template
    explains it. Validation, early stopping and the candidate's choice are among them, commented out."""
    shown = shown_keys(rendered(kind))
    assert {table: set(shown[table]) for table in accepted_keys()} == accepted_keys()
    commented = {key for key, is_set in shown["pipeline"].items() if not is_set}
    assert {
        "validate_every_epochs",
        "validate_every_steps",
        "early_stopping_metric",
        "early_stopping_patience",
        "early_stopping_min_delta",
        "candidate",
        "split",
        "bootstrap_resamples",
        "checkpoint_every_steps",
        "registry_lock",
        "mlflow_tracking_uri",
    } <= commented


def _uncommented(text: str, lines: set[int]) -> str:
    return "\n".join(
        line.removeprefix("# ") if number in lines else line for number, line in enumerate(text.splitlines())
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_commented_out_key_is_accepted_by_the_loader_once_uncommented(tmp_path, kind):
    """Each `# key = value` line uncommented alone, then all of them at once, loads through the real loader
    (so the template can never show a key, or a value, the loader refuses), with the value as written."""
    path = init_model("trial", kind, tmp_path).config  # custom: beside the task file it names
    text = path.read_text()
    commented = [
        number for number, line in enumerate(text.splitlines()) if (m := _SHOWN_KEY.match(line)) and m["mark"]
    ]
    assert len(commented) >= 15
    pipeline = load_pipeline_spec()
    for number in commented:
        path.write_text(_uncommented(text, {number}))
        load_model_config(path, pipeline)  # a refusal names the file and the key
    path.write_text(_uncommented(text, set(commented)))
    config = load_model_config(path, pipeline)
    document = tomllib.loads(path.read_text())
    assert dict(config.pipeline) == document["pipeline"]
    assert config.pipeline["early_stopping_metric"] == f"validation_{config.gate.primary_metric}"
    assert (config.trigger.account, config.trigger.depth) == ("mystorageaccount", 1)
    assert config.gate.confidence == 0.95


def test_the_kinds_share_one_gate_and_one_pipeline_template():
    """Only [task.options] and the gate's metrics and bounds are a kind's own: the rest is rendered from
    one text, so the kinds cannot drift apart."""
    for template in (TEMPLATES / f"{kind}.toml.tmpl" for kind in KINDS):
        assert not re.search(r"^#? ?\[|^#? ?(primary_metric|epochs|candidate) = ", template.read_text(), re.M)
    shared = {
        kind: {
            table: set(keys) for table, keys in shown_keys(rendered(kind)).items() if table != "task.options"
        }
        for kind in KINDS
    }
    assert shared["tabular"] == shared["custom"] == shared["image"]
    pipelines = {kind: rendered(kind).split("\n[pipeline]\n")[1].split("\n[trigger]\n")[0] for kind in KINDS}
    assert pipelines["tabular"] == pipelines["image"]  # the same primary metric
    assert pipelines["custom"] == pipelines["tabular"].replace("validation_macro_f1", "validation_mse")


# -- tabular: a configuration and a sample table, no code ----------------------------------------------------

TABULAR_OPTIONS = {
    "label_column": "churned",
    "key_column": "customer_id",
    "objective": "classification",
    "column_types": {"plan": "categorical", "city": "categorical", "autopay": "boolean"},
    "max_categories": 1000,
    "hidden_width": 256,
    "hidden_layers": 2,
    "dropout": 0.1,
}


def test_tabular_writes_a_runnable_configuration_and_a_sample_table_and_no_code(tmp_path):
    code, output = retrain_init(tmp_path, "churn", "--task", "tabular")

    config_path = tmp_path / "models" / "churn.toml"
    sample = tmp_path / "landing" / "churn" / SAMPLE_FILE
    assert code == 0
    assert output.splitlines()[:2] == [
        f"wrote {config_path}",
        f"wrote {sample} (sample data: {SAMPLE_ROWS} customers, churned or not)",
    ]
    assert printed_commands(output) == [
        [RETRAIN_SCRIPT, "run", "--model-name", "churn", "--data", "landing/churn"]
    ]
    written = {path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file()}
    assert written == {"landing/churn/batch-0001.csv", "models/churn.toml"}  # no task file, no Python at all

    config = load_model_config(config_path)
    assert (config.name, config.task.ref, config.task.text) == ("churn", "tabular", "tabular")
    assert dict(config.task.options) == TABULAR_OPTIONS
    shown = shown_keys(config_path.read_text())["task.options"]
    assert shown == {**dict.fromkeys(TABULAR_OPTIONS, True), **dict.fromkeys(
        ("feature_columns", "classes", "class_weights"), False
    )}  # fmt: skip
    assert config.gate.primary_metric == "macro_f1" and config.trigger.prefix == "churn"
    assert unexplained_keys(config_path.read_text()) == []


def test_the_tabular_sample_is_the_table_its_configuration_describes(tmp_path):
    """Numeric, categorical and boolean columns, blanks in some features, a label of names: the table the
    configuration's options name, the same bytes on every machine."""
    import pandas as pd

    init_model("churn", "tabular", tmp_path / "models", sample_folder=tmp_path / "landing" / "churn")
    path = tmp_path / "landing" / "churn" / SAMPLE_FILE
    assert path.read_bytes() == sample_csv() == sample_csv(SAMPLE_ROWS, 0)  # deterministic
    table = pd.read_csv(path)
    options = load_model_config(tmp_path / "models" / "churn.toml").task.options

    assert tuple(table.columns) == COLUMNS
    assert (options["key_column"], options["label_column"]) == (KEY_COLUMN, LABEL_COLUMN)
    assert options["column_types"] == COLUMN_TYPES and set(COLUMN_TYPES) <= set(table.columns)
    assert 200 <= len(table) <= 1000 and table[KEY_COLUMN].is_unique
    assert table[[KEY_COLUMN, LABEL_COLUMN]].notna().all().all()
    labels = table[LABEL_COLUMN]
    assert labels.dtype == object and set(labels) == set(CLASSES) == {"yes", "no"}
    assert 0.2 <= (labels == "yes").mean() <= 0.5  # both classes well represented
    blanks = table.isna().sum()
    assert {name for name, count in blanks.items() if count} == {
        "monthly_charges", "support_calls", "city", "autopay"
    }  # fmt: skip
    for numeric in ("tenure_months", "monthly_charges", "support_calls"):
        assert pd.api.types.is_numeric_dtype(table[numeric])
    assert set(table["autopay"].dropna()) == {True, False}  # read as booleans: true / false
    assert set(table["plan"]) == {"monthly", "annual", "two-year"} and table["city"].nunique() >= 10
    raw = path.read_text().splitlines()
    assert raw[0] == ",".join(COLUMNS) and any(",," in line for line in raw[1:])  # blanks are empty cells


def test_tabular_init_leaves_existing_data_alone(tmp_path):
    landing = tmp_path / "landing" / "churn"
    landing.mkdir(parents=True)
    (landing / "mine.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match=r"landing/churn: exists already and is not an empty folder"):
        retrain_init(tmp_path, "churn", "--task", "tabular")
    assert not (tmp_path / "models").exists() and [p.name for p in landing.iterdir()] == ["mine.csv"]


def test_a_tabular_configuration_that_cannot_be_written_leaves_no_sample(tmp_path, monkeypatch):
    from components.local import model_init

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(model_init, "render_config", broken)
    with pytest.raises(OSError, match="disk full"):
        init_model("churn", "tabular", tmp_path / "models", sample_folder=tmp_path / "landing" / "churn")
    assert not (tmp_path / "landing" / "churn").exists()
    assert not (tmp_path / "models" / "churn.toml").exists()


# -- the custom task runs as it is -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def custom(tmp_path_factory) -> dict[str, Path]:
    """A custom task written by init, and raw data generated by its own --sample."""
    root = tmp_path_factory.mktemp("custom")
    task_file = init_model("house", "custom", root / "models").task_file
    raw = root / "raw"
    done = subprocess.run(
        [sys.executable, str(task_file), "--sample", str(raw), "--rows", "600"],
        cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {"root": root, "task_file": task_file, "raw": raw}


def test_the_custom_task_keeps_the_whole_contract(custom):
    from training.data.splits import SplitFractions
    from training.tasks.base import missing_parts
    from training.tasks.loader import load_task

    task = load_task(f"{custom['task_file']}:HouseTask", {"hidden_width": 8})
    assert missing_parts(task) == []
    assert sorted(path.name for path in custom["raw"].iterdir()) == [
        f"batch-000{n}.csv" for n in (1, 2, 3, 4)
    ]

    prepared = custom["root"] / "prepared"
    version = task.prepare(custom["raw"], prepared, previous=None, split=SplitFractions())
    data = task.load(prepared)
    assert data.data_version == version and sum(len(data.split(name)) for name in data.splits) == 600
    again = task.prepare(custom["raw"], custom["root"] / "again", previous=prepared, split=SplitFractions())
    assert again == version  # the version is the content's

    import pandas as pd
    import torch

    model = task.build_model(data.info).eval()
    with torch.no_grad():
        scores = task.score(model, data.split("test"))
        answers = task.predict(model, data.info, pd.read_csv(custom["raw"] / "batch-0001.csv"))
    assert set(scores) == {"mse", "mae"} and all(value >= 0 for value in scores.values())
    assert answers.shape == (150,)
    assert task.drift_features(custom["raw"], prepared=False).values.shape == (600, 4)
    assert task.drift_features(prepared, prepared=True).names == ("x0", "x1", "x2", "x3")


def test_the_custom_task_trains_from_shards_that_load_maps_and_checks(custom, tmp_path):
    """Prepare writes each split as shards (training/data/shards.py) holding every row once, as float32;
    load maps them, refusing a changed one by its name."""
    import csv

    import numpy as np
    import torch

    from core.errors import InputError
    from training.data.shards import ShardSplit
    from training.data.splits import SPLIT_NAMES, SplitFractions
    from training.tasks.loader import load_task

    task = load_task(f"{custom['task_file']}:HouseTask", {})
    prepared = tmp_path / "prepared"
    task.prepare(custom["raw"], prepared, previous=None, split=SplitFractions())
    data = task.load(prepared)

    shards = {f"{name}-00000.{part}.npy" for name in SPLIT_NAMES for part in ("inputs", "targets")}
    assert {path.name for path in prepared.iterdir()} == {"manifest.json", *shards}
    raw_rows = {}
    for path in sorted(custom["raw"].glob("*.csv")):
        with path.open(newline="") as handle:
            raw_rows.update({row["key"]: row for row in csv.DictReader(handle)})
    as_float32 = [
        tuple(float(np.float32(float(row[column]))) for column in ("x0", "x1", "x2", "x3", "y"))
        for row in raw_rows.values()
    ]
    loaded = []
    for name in SPLIT_NAMES:
        split = data.split(name)
        assert isinstance(split, ShardSplit)
        inputs, targets = split[torch.arange(len(split))]
        loaded += [
            (*features, target) for features, target in zip(inputs.tolist(), targets.tolist(), strict=True)
        ]
    assert len(loaded) == 600 and sorted(loaded) == sorted(as_float32)

    shard = prepared / "validation-00000.inputs.npy"
    changed = bytearray(shard.read_bytes())
    changed[-1] ^= 0xFF
    shard.write_bytes(bytes(changed))
    with pytest.raises(InputError, match=r"validation-00000\.inputs\.npy: sha256 differs from the manifest"):
        task.load(prepared)


@pytest.mark.parametrize("target", ["nan", "inf", "-Infinity"])
def test_the_custom_task_refuses_a_target_that_is_not_finite_in_one_line(custom, tmp_path, target):
    from core.errors import InputError
    from training.data.splits import SplitFractions
    from training.tasks.loader import load_task

    raw = tmp_path / "raw"
    shutil.copytree(custom["raw"], raw)
    lines = (raw / "batch-0002.csv").read_text().splitlines()
    cells = lines[4].split(",")
    lines[4] = ",".join([*cells[:-1], target])  # the fourth data row's y
    (raw / "batch-0002.csv").write_text("\n".join(lines) + "\n")
    task = load_task(f"{custom['task_file']}:HouseTask", {})

    with pytest.raises(InputError) as refused:
        task.prepare(raw, tmp_path / "prepared", previous=None, split=SplitFractions())

    assert str(refused.value) == (
        f"{raw / 'batch-0002.csv'}, line 5, column y: expected finite numbers in x0, x1, x2, x3, y, "
        f"got {target!r}"
    )
    assert not (tmp_path / "prepared").exists()
