"""Bad trainer input gets one line naming the input and the fix, and changes nothing on disk."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers.training.small_run import NO_TRACKING, SMALL_RUN

from training.cli import main
from training.tasks.tabular.prepare import prepare
from training.tasks.tabular.sample_data import write_sample_batches


@pytest.fixture(scope="module")
def other_data_version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample data without its last batch: another data version with the same schema."""
    root = tmp_path_factory.mktemp("other")
    write_sample_batches(root / "raw", batches=4)
    (root / "raw" / "batch-0004.csv").unlink()
    prepare(root / "raw", root / "prepared")
    return root / "prepared"


@pytest.fixture(scope="module")
def trained(prepared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished single-process run, whose checkpoints the tests below try to misuse."""
    root = tmp_path_factory.mktemp("trained")
    folders = {"checkpoints": root / "checkpoints", "out": root / "out"}
    code = main(
        [
            "train",
            "--data",
            str(prepared_data),
            "--out",
            str(folders["out"]),
            "--checkpoints",
            str(folders["checkpoints"]),
            *SMALL_RUN,
            *NO_TRACKING,
            "--progress",
            "none",
        ]
    )
    assert code == 0
    return folders


def _train(data: Path, out: Path, checkpoints: Path | str, *extra: str) -> int:
    return main(
        [
            "train",
            "--data",
            str(data),
            "--out",
            str(out),
            "--checkpoints",
            str(checkpoints),
            *SMALL_RUN,
            *NO_TRACKING,
            "--progress",
            "none",
            *extra,
        ]
    )


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("retrain: error:")]
    assert len(lines) == 1
    return lines[0]


def _fingerprint(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--epochs", "0"], "--epochs 0: expected a whole number >= 1"),
        (["--keep-checkpoints", "1"], "--keep-checkpoints 1: expected a whole number >= 2"),
        (["--checkpoint-every-steps", "-5"], "--checkpoint-every-steps -5: expected a whole number >= 1"),
        (["--nproc", "2", "--global-batch-size", "33"], "--global-batch-size 33 is not divisible by 2"),
        (["--global-batch-size", "5000"], "larger than the training split (1421 rows)"),
        (["--task-option", "dropout=1.5"], "--task 'tabular': dropout 1.5: expected a probability in [0, 1)"),
        (["--task", "nowhere.py:Task"], "--task 'nowhere.py:Task': no file"),
        (["--task-option", "colour=red"], "--task 'tabular': unknown option(s) ['colour']"),
        (["--task-options", "[1]"], "--task-options '[1]': expected a JSON object"),
        (
            ["--strategy", "fsdp", "--checkpoint-layout", "single"],
            "options: checkpoint_layout single with strategy fsdp: no process holds the whole state",
        ),
        (["--strategy", "fsdp", "--precision", "16-mixed"], "use bf16-mixed or 32"),
    ],
)
def test_bad_options_are_refused_in_one_line(prepared_data, tmp_path, capsys, extra, expected):
    assert _train(prepared_data, tmp_path / "out", tmp_path / "ckpt", *extra) == 2
    assert expected in _one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_missing_data_folder_is_named(tmp_path, capsys):
    assert _train(tmp_path / "nowhere", tmp_path / "out", tmp_path / "ckpt") == 2
    assert f"--data {tmp_path / 'nowhere'}: no such folder" in _one_error_line(capsys)


def test_a_folder_that_is_not_prepared_data_is_refused(tmp_path, capsys):
    (tmp_path / "raw").mkdir()
    assert _train(tmp_path / "raw", tmp_path / "out", tmp_path / "ckpt") == 2
    assert "prepare" in _one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_credential_in_the_checkpoint_url_is_refused_without_echoing_it(prepared_data, tmp_path, capsys):
    url = "https://acct.blob.core.windows.net/ckpt/run?sv=2024&sig=SECRETSIGNATURE"
    assert _train(prepared_data, tmp_path / "out", url) == 2
    line = _one_error_line(capsys)
    assert "credentials in the URL" in line and "SECRETSIGNATURE" not in line


@pytest.mark.parametrize("nproc", ["1", "2"])  # with 2, the launcher refuses before starting torchrun
def test_resuming_on_other_data_is_refused_and_leaves_the_checkpoints_intact(
    trained, other_data_version, tmp_path, capsys, nproc
):
    before = _fingerprint(trained["checkpoints"])
    assert _train(other_data_version, tmp_path / "out", trained["checkpoints"], "--nproc", nproc) == 2
    line = _one_error_line(capsys)
    old_version = json.loads((trained["out"] / "metadata.json").read_text())["data_version"]
    assert old_version in line and "--allow-data-change" in line
    assert _fingerprint(trained["checkpoints"]) == before
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_resuming_with_other_training_options_is_refused(trained, prepared_data, tmp_path, capsys, nproc):
    before = _fingerprint(trained["checkpoints"])
    assert (
        _train(prepared_data, tmp_path / "out", trained["checkpoints"], "--seed", "8", "--nproc", nproc) == 2
    )
    assert "--seed 8 (checkpoint: 7)" in _one_error_line(capsys)
    assert _fingerprint(trained["checkpoints"]) == before


def test_resuming_with_other_epochs_is_refused(trained, prepared_data, tmp_path, capsys):
    # The learning-rate schedule spans the total steps: under other epochs, a resume would be another run.
    before = _fingerprint(trained["checkpoints"])
    assert _train(prepared_data, tmp_path / "out", trained["checkpoints"], "--epochs", "6") == 2
    assert "--epochs 6 (checkpoint: 2)" in _one_error_line(capsys)
    assert _fingerprint(trained["checkpoints"]) == before
    assert not (tmp_path / "out").exists()


def test_other_data_is_accepted_when_forced(trained, other_data_version, tmp_path):
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    for path in trained["checkpoints"].iterdir():
        (checkpoints / path.name).write_bytes(path.read_bytes())
    # The same epochs: --allow-data-change lets the data change, not the options that decide the run.
    assert _train(other_data_version, tmp_path / "out", checkpoints, "--allow-data-change") == 0
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert (
        metadata["data_version"]
        == json.loads((other_data_version / "manifest.json").read_text())["data_version"]
    )
    assert metadata["attempts"][-1]["resumed_from"] is not None and metadata["resumes"] == 1
