"""Names are checked whole and before any path is built from them; every unreadable configuration or
unwritable folder is one line naming the input and the expected form (issue 20, items 11 and 12)."""

from __future__ import annotations

import pytest

import retrain_cli
from components.errors import ConfigError, SubmissionError
from components.model_config import config_file, load_model_config
from components.specs import load_pipeline_spec
from core.names import check_model_name

PIPELINE = load_pipeline_spec()


def retrain(capsys, *argv: str) -> tuple[int, str]:
    code = retrain_cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working folder with models/ and an empty data folder; local state under it."""
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    (work / "data").mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("RETRAIN_HOME", str(work / "state"))
    monkeypatch.delenv("RETRAIN_MODELS_DIR", raising=False)
    return work


@pytest.mark.parametrize("name", ["nl\n", "digits\n", "a" * 5000, "../../evil", ""])
def test_a_model_name_is_matched_whole(name):
    with pytest.raises(SubmissionError, match=r"model name '.*': expected 1-40 lowercase") as raised:
        check_model_name(name, "model name", SubmissionError)
    assert "\n" not in str(raised.value)
    assert len(str(raised.value)) < 200  # a 5,000-character name is clipped, not echoed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[gate]\nprimary_metric = "accuracy\\n"\n', r"\[gate\].primary_metric is 'accuracy\\n'"),
        ('[gate]\nfloors = { "accuracy\\n" = 0.5 }\n', r"\[gate\] floors names 'accuracy\\n'"),
        ('[trigger]\naccount = "irisdata\\n"\n', r"\[trigger\].account is 'irisdata\\n'"),
        ('[trigger]\ncontainer = "landing\\n"\n', r"\[trigger\].container is 'landing\\n'"),
        ('[trigger]\nprefix = "flowers\\n/iris"\n', r"\[trigger\] prefix is 'flowers\\n/iris'"),
        ('[trigger]\nsuffixes = [".csv\\n"]\n', r"\[trigger\] suffixes has '.csv\\n'"),
        ('name = "iris\\n"\n', r"name 'iris\\n': expected 1-40"),
    ],
)
def test_a_trailing_newline_is_refused_in_every_configured_name(tmp_path, text, message):
    path = tmp_path / "iris.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_model_config(path, PIPELINE)


def test_no_path_is_built_from_a_name_that_is_not_one(tmp_path):
    with pytest.raises(ConfigError, match=r"model name '\.\./\.\./evil': expected"):
        config_file("../../evil", tmp_path, {})


def test_run_refuses_a_newline_model_name_before_any_folder_is_made(workdir, capsys):
    code, err = retrain(capsys, "run", "--data", "data", "--model-name", "nl\n")
    assert code == 2
    assert err == "retrain: error: model name 'nl\\n': expected 1-40 lowercase letters, digits or '-', " \
        "starting with a letter\n"  # fmt: skip
    assert not (workdir / "state").exists()


def test_run_never_opens_the_file_a_traversing_model_name_points_at(workdir, capsys):
    # models/../../evil.toml: outside the models folder; before the fix it was read (and refused as TOML).
    (workdir.parent / "evil.toml").write_text("this is [not toml")
    code, err = retrain(capsys, "run", "--data", "data", "--model-name", "../../evil")
    assert code == 2
    assert err.startswith("retrain: error: model name '../../evil': expected 1-40")
    assert "evil.toml" not in err


def _one_line(err: str) -> str:
    assert err.startswith("retrain: error: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_configuration_that_is_not_utf8_is_one_line(workdir, capsys):
    (workdir / "models" / "bad.toml").write_bytes(b'name = "\xff"\n')
    code, err = retrain(capsys, "run", "--data", "data", "--model-name", "bad")
    assert code == 2
    assert "bad.toml: byte 8 is not UTF-8; expected TOML saved as UTF-8 text" in _one_line(err)


def test_a_deeply_nested_array_is_one_line(workdir, capsys):
    (workdir / "models" / "deep.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    code, err = retrain(capsys, "run", "--data", "data", "--model-name", "deep")
    assert code == 2
    assert "deep.toml: arrays or tables nested too deeply; expected TOML" in _one_line(err)


def test_config_naming_a_folder_is_one_line(workdir, capsys):
    code, err = retrain(capsys, "run", "--data", "data", "--config", "models")
    assert code == 2
    assert "models: is a folder; expected a model configuration file" in _one_line(err)


def test_config_naming_an_endless_file_is_read_with_a_bound(workdir, capsys):
    code, err = retrain(capsys, "run", "--data", "data", "--config", "/dev/zero")
    assert code == 2
    assert "/dev/zero: larger than 1024 KiB; expected a model configuration" in (_one_line(err))


def test_a_five_thousand_character_model_name_is_one_short_line(workdir, capsys):
    code, err = retrain(capsys, "run", "--data", "data", "--model-name", "a" * 5000)
    assert code == 2
    assert "expected 1-40 lowercase letters" in _one_line(err)
    assert len(err) < 200


@pytest.mark.parametrize("under", ["a-file", "/proc/no-such-folder"])
def test_init_under_a_parent_that_cannot_hold_a_folder_is_one_line(workdir, capsys, under):
    (workdir / "a-file").write_text("")
    code, err = retrain(capsys, "init", "flat", "--task", "tabular", "--dir", f"{under}/models")
    assert code == 2
    assert f"{under}/models: cannot be created (" in _one_line(err)
    assert "expected a folder that exists or can be made" in err
