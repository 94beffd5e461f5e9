"""LocalSubmitter: the Submitter protocol over the local runner, and `retrain run`'s input errors."""

from __future__ import annotations

import argparse
import io
import logging
import os
from pathlib import Path

import pytest
from helpers.components.quick_pipeline import QuickPipeline, QuickRequest

from components.data_version import DataError
from components.errors import ConfigError, SubmissionError
from components.local import RunnerOptions, RunStore
from components.local import cli as local_cli
from components.local.submitter import LocalSubmitter
from components.request import COMPLETED, FAILED, Submitter


def quick_submitter(quick: QuickPipeline, state: Path, progress: io.StringIO | None = None) -> LocalSubmitter:
    options = RunnerOptions(state, pipeline_file=quick.pipeline_file, environment_file=quick.environment_file)
    return LocalSubmitter(options, os.environ, progress)


def test_submit_runs_the_pipeline_and_status_reports_the_newest_run_of_a_job(
    quick_pipeline, quick_request: QuickRequest, tmp_path
):
    submitter: Submitter = quick_submitter(quick_pipeline, tmp_path / "state", io.StringIO())
    request = quick_request()

    submission = submitter.submit(request)

    assert (submission.job_name, submission.backend, submission.status) == (
        request.job_name(),
        "local",
        COMPLETED,
    )
    assert submission.run_key == request.run_key and submission.finished
    assert Path(submission.details["outputs"]["result"], "result.txt").read_text() == "result 60"
    again = submitter.submit(request)
    assert again.details["steps"]["make"] == {"status": COMPLETED, "reused": True}
    status = submitter.status(request.job_name())
    assert status.details["run_id"] == again.details["run_id"] != submission.details["run_id"]


def test_a_failed_run_is_a_failed_submission_with_the_step_and_its_log_tail(
    quick_pipeline, quick_request, tmp_path, caplog
):
    submitter = quick_submitter(quick_pipeline, tmp_path / "state")
    with caplog.at_level(logging.INFO, logger="components.local.submitter"):
        submission = submitter.submit(quick_request(parameters={"exit_code": 4}))

    assert submission.status == FAILED
    assert submission.details["failed_step"] == "finish"
    assert submission.details["error"].startswith("step 'finish' failed with exit code 4")
    assert submission.details["log_tail"][-1] == "finish: failing on purpose, as asked"
    assert submitter.status(submission.job_name).status == FAILED
    assert "make      started" in caplog.text  # with no stream given, progress goes to the log


def test_a_previous_prepared_version_that_is_gone_is_dropped_with_a_warning_and_the_run_goes_on(
    quick_pipeline, quick_request, tmp_path, caplog
):
    make = quick_pipeline.folder / "make.yml"  # `make` plays prep: it takes a previous version
    make.write_text(
        make.read_text()
        .replace(
            "  note: {type: string, optional: true}\n",
            "  previous_prepared: {type: uri_folder, optional: true}\n",
        )
        .replace("$[[--note ${{inputs.note}}]]", "$[[--note ${{inputs.previous_prepared}}]]")
    )
    gone = tmp_path / "state" / "cache" / "prep" / "0123abcd" / "prepared_data"  # a cleared cache entry
    submitter = quick_submitter(quick_pipeline, tmp_path / "state", io.StringIO())
    request = quick_request(previous_prepared=str(gone))
    caplog.set_level(logging.WARNING, logger="components.local.submitter")

    submission = submitter.submit(request)

    assert submission.status == COMPLETED
    run = RunStore(tmp_path / "state" / "runs").load(submission.details["run_id"])
    assert "--note" not in run.step("make").command  # the step was not given the folder
    [line] = [record.getMessage() for record in caplog.records]
    assert line == (
        f"run {request.run_key}: its previous prepared data version {gone} is gone; it is prepared from the "
        "raw data alone, its schema from most of that data"
    )


def test_status_of_an_unknown_job_is_a_one_line_error(quick_pipeline, tmp_path):
    with pytest.raises(
        SubmissionError, match=r"job name 'retrain-x': no local run has it; `retrain runs` lists"
    ):
        quick_submitter(quick_pipeline, tmp_path / "state").status("retrain-x")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="retrain")
    local_cli.register_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--param", "epochs"], "expected KEY=VALUE (a pipeline or component input), got 'epochs'"),
        (["--epochs", "0"], "expected a positive integer, got 0"),
        (["--nproc", "two"], "expected a positive integer, got 'two'"),
    ],
)
def test_malformed_run_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        parse("run", "--data", "raw", *argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "error", "message"),
    [
        (
            ["--param", "epochs=3", "--epochs", "2"],
            SubmissionError,
            r"--epochs and --param epochs=...: both given",
        ),
        (["--param", "a=1", "--param", "a=2"], SubmissionError, r"--param a: given twice"),
        (["--param", "epochz=1"], SubmissionError, r"parameters \['epochz'\]: not inputs of the pipeline"),
        (["--model-name", "Digits!"], ConfigError, r"model name 'Digits!': expected 1-40 lowercase"),
    ],
)
def test_bad_run_input_is_a_one_line_error_and_writes_no_run(argv, error, message, tmp_path, sample_raw):
    args = parse("run", "--data", str(sample_raw), "--task", "tabular", *argv)
    args.state_root, args.environ = tmp_path / "state", {}
    with pytest.raises(error, match=message) as raised:
        args.handler(args, io.StringIO())
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "state" / "runs").exists()


def test_a_model_without_a_configuration_file_is_refused_naming_where_it_looked_unless_a_task_is_given(
    tmp_path, sample_raw, capsys
):
    args = parse("run", "--data", str(sample_raw), "--model-name", "iris")
    args.state_root, args.environ = tmp_path / "state", {"RETRAIN_MODELS_DIR": str(tmp_path / "conf")}
    with pytest.raises(ConfigError) as missing:
        args.handler(args, io.StringIO())
    assert str(missing.value).startswith(
        f"model 'iris': no configuration file {tmp_path / 'conf' / 'iris.toml'} "
        f"(RETRAIN_MODELS_DIR={tmp_path / 'conf'}); expected one: `retrain init iris --task"
    )
    assert not (tmp_path / "state").exists()  # nothing pinned, no run recorded

    with pytest.raises(SystemExit):
        parse("run", "--help")
    assert "$RETRAIN_MODELS_DIR" in " ".join(capsys.readouterr().out.split())


def test_a_missing_data_folder_is_a_one_line_error(tmp_path):
    args = parse("run", "--data", str(tmp_path / "nowhere"), "--task", "tabular")
    args.state_root, args.environ = tmp_path / "state", {}
    with pytest.raises(DataError, match=r"--data .*/nowhere: no such folder"):
        args.handler(args, io.StringIO())


def test_runs_with_no_runs_says_how_to_start_one(tmp_path):
    args = parse("runs")
    args.state_root, args.environ = tmp_path / "state", {}
    out = io.StringIO()
    assert args.handler(args, out) == 0
    assert (
        out.getvalue()
        == f"no local runs under {tmp_path / 'state' / 'runs'}; `retrain run --data RAW` starts one\n"
    )
