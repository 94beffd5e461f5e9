"""A model's configuration file: read with the standard library, checked key by key, one line per error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from components.errors import ConfigError, SubmissionError
from components.model_config import (
    MODELS_DIR_VARIABLE,
    bounds_text,
    config_file,
    find_model_config,
    load_model_config,
    models_dir,
)
from components.run_settings import resolve_run_settings
from components.specs import REPO_ROOT, load_pipeline_spec

PIPELINE = load_pipeline_spec()

FULL = """\
name = "iris"
[task]
ref = "tabular"
[task.options]
label_column = "species"
key_column = ""
classes = ["setosa", "versicolor", "virginica"]
hidden_width = 32
[gate]
primary_metric = "accuracy"
min_improvement = 0.01
floors = { accuracy = 0.7, loss = 1.5 }
max_regression = { macro_f1 = 0.02, "recall_*" = 0.2 }
first_model_floors = { accuracy = 0.75 }
bootstrap_unloadable_champion = true
[pipeline]
epochs = 7
learning_rate = 0.01
checkpoint_every_seconds = 300
checkpoint_every_steps = 25
[trigger]
account = "irisdata"
container = "landing"
prefix = "flowers/iris/"
suffixes = [".csv"]
"""


def write(folder: Path, text: str, name: str = "iris.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_every_section_is_read_into_the_run_request_s_values(tmp_path):
    config = load_model_config(write(tmp_path, FULL), PIPELINE)

    assert (config.name, config.task.text) == ("iris", "tabular")
    assert dict(config.task.options) == {
        "label_column": "species",
        "key_column": "",
        "classes": ["setosa", "versicolor", "virginica"],
        "hidden_width": 32,
    }
    assert config.parameters() == {
        "epochs": 7,
        "learning_rate": 0.01,
        "checkpoint_every_seconds": 300,
        "checkpoint_every_steps": 25,
        # The register step's inputs, in the gate's own METRIC=NUMBER form.
        "primary_metric": "accuracy",
        "min_improvement": 0.01,
        "floors": "accuracy=0.7,loss=1.5",
        "max_regression": "macro_f1=0.02,recall_*=0.2",
        "first_model_floors": "accuracy=0.75",
        "bootstrap_unloadable_champion": "true",
    }
    trigger = config.trigger
    assert (trigger.account, trigger.container, trigger.prefix, trigger.suffixes) == (
        "irisdata", "landing", "flowers/iris", (".csv",)
    )  # fmt: skip


def test_a_minimal_file_is_the_tabular_task_with_every_default(tmp_path):
    config = load_model_config(write(tmp_path, "", name="house-prices.toml"), PIPELINE)
    assert (config.name, config.task.text, dict(config.task.options)) == ("house-prices", "tabular", {})
    assert config.parameters() == {}  # the register step then takes the task's defaults
    assert config.trigger_suffixes() == (".csv", ".parquet")  # the built-in task's raw files
    assert bounds_text({}) == "none"


def test_a_task_file_is_found_relative_to_the_configuration_and_its_suffixes_come_from_the_task(tmp_path):
    (tmp_path / "models" / "tasks").mkdir(parents=True)
    (tmp_path / "models" / "tasks" / "house.py").write_text(
        'import torch\n\nclass HouseTask:\n    raw_suffixes = (".csv", ".tsv")\n'
    )
    path = write(tmp_path / "models", '[task]\nref = "tasks/house.py:HouseTask"\n', "house.toml")

    config = load_model_config(path, PIPELINE)

    assert config.task.ref == "tasks/house.py:HouseTask"
    assert config.task.reference.path == tmp_path / "models" / "tasks" / "house.py"
    assert config.task.text == f"{tmp_path / 'models' / 'tasks' / 'house.py'}:HouseTask"
    # The task's raw_suffixes, read from its code without importing it (its torch import never runs).
    assert config.trigger_suffixes() == (".csv", ".tsv")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nmae = 'x'\n", r"key 'nmae' is not known; expected one of name, task, gate, pipeline, trigger"),
        ("[gate]\nprimary = 'mse'\n", r"\[gate\] key 'primary' is not known; expected one of primary_metric"),
        ("[task]\nrefs = 'x'\n", r"\[task\] key 'refs' is not known"),
        ("[trigger]\nsuffix = ['.csv']\n", r"\[trigger\] key 'suffix' is not known"),
        ("[task]\nref = 3\n", r"\[task\] ref is int 3; expected text naming the task"),
        ("[task]\nref = 'nope'\n", r"\[task\] ref 'nope': expected a built-in \(tabular, image\)"),
        ("[task]\nref = 'gone.py:Task'\n", r"\[task\] ref 'gone.py:Task': no file .*gone.py"),
        ("[task.options]\nwidth = nan\n", r"\[task.options\].width: nan is not a finite number"),
        (
            "[gate]\nprimary_metric = 'f1 score'\n",
            r"\[gate\].primary_metric is 'f1 score'; expected a metric",
        ),
        ("[gate]\nmin_improvement = -0.1\n", r"\[gate\] min_improvement is -0.1; expected a number >= 0"),
        ("[gate]\nmin_improvement = '0.1'\n", r"\[gate\] min_improvement is '0.1'; expected a finite number"),
        ("[gate]\nfloors = 'accuracy=0.9'\n", r"\[gate\] floors is 'accuracy=0.9'; expected a table"),
        (
            "[gate]\nfloors = { accuracy = true }\n",
            r"\[gate\] floors.accuracy is bool True; expected a finite",
        ),
        (
            "[gate]\nfloors = { 'recall_*' = 0.5 }\n",
            r"\[gate\] floors names 'recall_\*'; expected a metric name",
        ),
        (
            "[gate]\nmax_regression = { loss = -1 }\n",
            r"\[gate\] max_regression.loss is -1; expected a number >= 0",
        ),
        (
            "[gate]\nbootstrap_unloadable_champion = 'yes'\n",
            r"bootstrap_unloadable_champion is 'yes'; expected true",
        ),
        ("[pipeline]\nepochz = 3\n", r"\[pipeline\] parameters \['epochz'\]: not inputs of the pipeline"),
        (
            "[pipeline]\nhidden_width = 64\n",
            r"\[pipeline\] parameter hidden_width: an option of the tabular task",
        ),
        ("[pipeline]\nepochs = 2.5\n", r"\[pipeline\] epochs is float 2.5; expected a whole number"),
        ("[pipeline]\nlearning_rate = 'fast'\n", r"\[pipeline\] learning_rate is 'fast'; expected a number"),
        (
            "[pipeline]\nfloors = 'none'\n",
            r"\[pipeline\] floors is a gate setting; expected it under \[gate\]",
        ),
        (
            "[pipeline]\ntask = 'image'\n",
            r"\[pipeline\] task is set by the run itself; expected the task under",
        ),
        (
            "[trigger]\naccount = 'My_Account'\n",
            r"\[trigger\].account is 'My_Account'; expected a storage account",
        ),
        ("[trigger]\ncontainer = 'a--b'\n", r"\[trigger\].container is 'a--b'; expected a container name"),
        ("[trigger]\nprefix = '/abs'\n", r"\[trigger\] prefix is '/abs'; expected folder names"),
        ("[trigger]\nprefix = 'a/../b'\n", r"\[trigger\] prefix is 'a/../b'; expected folder names"),
        ("[trigger]\nsuffixes = ['csv']\n", r"\[trigger\] suffixes has 'csv'; expected a non-empty list"),
        ("[trigger]\nsuffixes = []\n", r"\[trigger\] suffixes is list \[\]; expected a non-empty list"),
        ("gate = 1\n", r"\[gate\] is int 1; expected a table"),
        ("name = 'Iris!'\n", r"name 'Iris!': expected 1-40 lowercase letters"),
        ("[task\n", r"not valid TOML"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_the_key_and_the_expected_form(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as raised:
        load_model_config(path, PIPELINE)
    assert str(raised.value).startswith(f"{path}: ")
    assert "\n" not in str(raised.value)


def test_a_file_whose_stem_is_no_model_name_must_name_its_model(tmp_path):
    path = write(tmp_path, "", name="My Model.toml")
    with pytest.raises(ConfigError, match=r"My Model.toml: the file's stem 'My Model': expected 1-40"):
        load_model_config(path, PIPELINE)
    assert load_model_config(write(tmp_path, 'name = "mine"\n', "My Model.toml"), PIPELINE).name == "mine"


def test_configurations_live_in_models_under_the_working_folder_unless_the_setting_moves_them(tmp_path):
    assert models_dir(tmp_path, {}) == tmp_path / "models"
    assert models_dir(tmp_path, {MODELS_DIR_VARIABLE: "conf/models"}) == tmp_path / "conf" / "models"
    assert models_dir(tmp_path, {MODELS_DIR_VARIABLE: "/etc/retrain"}) == Path("/etc/retrain")
    assert config_file("digits", tmp_path, {}) == tmp_path / "models" / "digits.toml"

    assert find_model_config("iris", tmp_path, {}) is None
    write(tmp_path / "elsewhere", FULL)
    assert find_model_config("iris", tmp_path, {MODELS_DIR_VARIABLE: "elsewhere"}).name == "iris"
    write(tmp_path / "elsewhere", 'name = "other"\n', "named.toml")
    with pytest.raises(ConfigError, match=r"named.toml: name 'other' differs from the file's stem 'named'"):
        find_model_config("named", tmp_path, {MODELS_DIR_VARIABLE: "elsewhere"})


@pytest.mark.parametrize("name", ["digits", "shapes"])
def test_the_repository_s_sample_configurations_load(name):
    config = load_model_config(REPO_ROOT / "models" / f"{name}.toml", PIPELINE)
    assert config.name == name
    assert config.task.text == {"digits": "tabular", "shapes": "image"}[name]
    assert config.parameters()["epochs"] == 5
    assert config.gate.primary_metric == "macro_f1"


def test_the_digits_configuration_is_today_s_defaults():
    """models/digits.toml spells out what a run without a configuration file trains with."""
    from components.specs import load_component_spec

    config = load_model_config(REPO_ROOT / "models" / "digits.toml", PIPELINE)
    pipeline_defaults = {name: PIPELINE.inputs[name] for name in config.pipeline}
    assert dict(config.pipeline) == pipeline_defaults
    register = load_component_spec(REPO_ROOT / "components" / "register.yml")
    assert all(register.inputs[name].optional for name in config.gate.parameters())
    assert config.gate.parameters() == {  # training/gate/policy.py's classifier defaults
        "primary_metric": "macro_f1",
        "min_improvement": 0.002,
        "floors": "accuracy=0.8",
        "max_regression": "accuracy=0.01,recall_*=0.1",
        "first_model_floors": "accuracy=0.9,macro_f1=0.9",
        "bootstrap_unloadable_champion": "false",
    }


# -- the command line over the file ---------------------------------------------------------------------


def settings(tmp_path: Path, **given):
    arguments = {
        "model_name": "iris",
        "config_file": None,
        "task": None,
        "task_options": None,
        "task_option": [],
        "parameters": {},
        "cwd": tmp_path,
        "environ": {},
        "pipeline": PIPELINE,
    }
    return resolve_run_settings(**{**arguments, **given})


def test_the_command_line_wins_over_the_file(tmp_path):
    write(tmp_path / "models", FULL)

    from_file = settings(tmp_path)
    assert from_file.parameters["epochs"] == 7 and from_file.task_options["hidden_width"] == 32
    assert from_file.where == f"{tmp_path / 'models' / 'iris.toml'} [gate]"

    given = settings(
        tmp_path,
        parameters={"epochs": "2", "floors": "accuracy=0.5"},
        task_options='{"hidden_width": 16, "dropout": 0.2}',
        task_option=["dropout=0.3"],
    )
    assert (given.parameters["epochs"], given.parameters["learning_rate"]) == ("2", 0.01)
    assert given.parameters["floors"] == "accuracy=0.5"
    assert given.where == "the gate policy (--param floors)"
    assert dict(given.task_options) == {
        "label_column": "species",
        "key_column": "",
        "classes": ["setosa", "versicolor", "virginica"],
        "hidden_width": 16,
        "dropout": 0.3,
    }


def test_another_task_on_the_command_line_drops_the_file_s_options(tmp_path):
    write(tmp_path / "models", FULL)
    (tmp_path / "mine.py").write_text("class Mine: ...\n")

    image = settings(tmp_path, task="image", task_option=["size=16"])
    assert (image.task, dict(image.task_options)) == ("image", {"size": 16})
    same = settings(tmp_path, task="tabular")
    assert same.task_options["label_column"] == "species"
    mine = settings(tmp_path, task="mine.py:Mine")  # relative to the working folder
    assert (mine.task, mine.task_sha256 is not None) == (f"{tmp_path / 'mine.py'}:Mine", True)


def test_without_a_file_a_run_needs_a_task_and_the_error_says_where_it_looked(tmp_path):
    with pytest.raises(ConfigError) as missing:
        settings(tmp_path, model_name=None)
    assert str(missing.value) == (
        f"model 'digits': no configuration file {tmp_path / 'models' / 'digits.toml'} (./models under the "
        "working folder; RETRAIN_MODELS_DIR moves it); expected one: `retrain init digits --task "
        "tabular|image|custom` writes it, or give --config FILE or --task REF"
    )
    write(tmp_path / "models", FULL)  # iris's file is there; it names no other model's
    with pytest.raises(ConfigError) as moved:
        settings(tmp_path, environ={MODELS_DIR_VARIABLE: "conf"})
    assert f"no configuration file {tmp_path / 'conf' / 'iris.toml'} (RETRAIN_MODELS_DIR=conf);" in str(
        moved.value
    )

    default = settings(tmp_path, model_name=None, task="tabular")  # the built-in task, as asked
    assert (default.model_name, default.task, dict(default.task_options), dict(default.parameters)) == (
        "digits", "tabular", {}, {}
    )  # fmt: skip
    shapes = settings(tmp_path, model_name="shapes", task="image")
    assert (shapes.model_name, shapes.task, shapes.config) == ("shapes", "image", None)


def test_an_explicit_file_names_the_model_and_a_different_model_name_is_refused(tmp_path):
    path = write(tmp_path / "conf", FULL)
    assert settings(tmp_path, model_name=None, config_file=Path("conf/iris.toml")).model_name == "iris"
    with pytest.raises(ConfigError, match=r"iris.toml: configures model 'iris', but --model-name is 'roses'"):
        settings(tmp_path, model_name="roses", config_file=path)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"task_option": ["hidden width=3"]}, r"--task-option 'hidden width=3': expected KEY=VALUE"),
        ({"task_options": "[1, 2]"}, r"--task-options '\[1, 2\]': expected a JSON object"),
        ({"task_options": "{oops"}, r"--task-options '\{oops': not JSON"),
        ({"task": "x.py"}, r"--task 'x.py': expected a built-in"),
        ({"parameters": {"task": "image"}}, r"parameter task: set by the run itself"),
        ({"parameters": {"hidden_width": "64"}}, r"parameter hidden_width: an option of the tabular task"),
        ({"parameters": {"epochs": "NaN"}}, r"parameter epochs is 'NaN'; expected a whole number >= 1"),
        ({"parameters": {"learning_rate": "-1"}}, r"parameter learning_rate is '-1'; expected a number > 0"),
    ],
)
def test_bad_command_line_values_are_one_line_errors(tmp_path, given, message):
    write(tmp_path / "models", FULL)
    with pytest.raises(SubmissionError, match=message):
        settings(tmp_path, **given)
