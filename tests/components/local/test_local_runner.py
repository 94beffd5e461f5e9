"""The local runner on a pipeline of quick steps: order, reuse, failure, preemption and restarts.

Every step is a real process running its component's real command line (JOB_SCRIPT in
tests/helpers/components/quick_pipeline.py).
"""

from __future__ import annotations

import io
import os
import re
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.components.quick_pipeline import QuickPipeline, QuickRequest, write_quick_pipeline
from helpers.components.run_requests import pinned_request

from components.checkpoint_key import checkpoint_key
from components.errors import SubmissionError
from components.local import LocalRunner, LocalStepFailed, RunnerOptions, RunRecord
from components.local.cache import STAGING_PREFIX
from components.local.launch import starts_as_module
from components.local.warm import WarmLauncher
from components.request import CANCELED, COMPLETED, FAILED, DataRef, RunRequest
from components.specs import REPO_ROOT, load_component_spec, load_pipeline_spec


def quick_runner(quick: QuickPipeline, state: Path, **options) -> tuple[LocalRunner, io.StringIO]:
    progress = io.StringIO()
    runner = LocalRunner(
        RunnerOptions(
            state_root=state,
            pipeline_file=quick.pipeline_file,
            environment_file=quick.environment_file,
            **options,
        ),
        os.environ,
        progress,
    )
    return runner, progress


def reused(record: RunRecord) -> dict[str, bool]:
    return {step.name: step.reused for step in record.steps}


def cache_entries(state: Path) -> dict[str, bytes]:
    """Every file of every published cache entry, with its bytes."""
    return {
        str(path.relative_to(state)): path.read_bytes()
        for path in sorted((state / "cache").glob("*/*/**/*"))
        if path.is_file() and not path.relative_to(state / "cache").parts[1].startswith(STAGING_PREFIX)
    }


def result_of(record: RunRecord) -> str:
    return (Path(record.outputs["result"]) / "result.txt").read_text()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def test_each_step_runs_its_command_in_dependency_order_with_its_inputs_and_outputs(
    quick_pipeline, quick_request: QuickRequest, state
):
    runner, progress = quick_runner(quick_pipeline, state)
    request = quick_request()
    record = runner.run(request)

    assert record.status == COMPLETED
    assert [step.name for step in record.steps] == ["make", "double", "finish"]
    assert result_of(record) == "result 60"  # (1 + 2 + 3 + 4) * factor 3 from pipeline.yml, doubled
    make = record.step("make")
    assert make.command[:3] == (sys.executable, "job.py", "make")
    assert "--note" not in make.command  # the optional part is dropped: note is unset
    log = Path(make.log).read_text()
    assert f"cwd {quick_pipeline.folder} home {state} python {sys.executable}" in log
    key = checkpoint_key(load_pipeline_spec(quick_pipeline.pipeline_file), "double", request)
    assert key.startswith(f"{record.run_key}-")
    assert record.step("double").outputs["progress"] == str(state / "progress" / key)
    assert [line.split()[:2] for line in progress.getvalue().splitlines()] == [
        ["make", "started"], ["make", "completed"], ["double", "started"], ["double", "completed"],
        ["finish", "started"], ["finish", "completed"],
    ]  # fmt: skip


def test_a_second_run_on_the_same_data_reuses_every_step(quick_pipeline, quick_request, state):
    runner, progress = quick_runner(quick_pipeline, state)
    first = runner.run(quick_request())
    second = runner.run(quick_request())

    assert reused(first) == {"make": False, "double": False, "finish": False}
    assert reused(second) == {"make": True, "double": True, "finish": True}
    assert second.outputs == first.outputs
    assert [step.attempts for step in second.steps] == [(), (), ()]  # nothing was started
    assert progress.getvalue().count("reused (cache entry") == 3


def test_a_parameter_reruns_its_step_and_downstream_until_an_output_is_unchanged(
    quick_pipeline, quick_request, state
):
    runner, _ = quick_runner(quick_pipeline, state)
    runner.run(quick_request())

    same_as_default = runner.run(quick_request(parameters={"factor": 3, "preempt_times": "0"}))
    assert reused(same_as_default) == {"make": True, "double": True, "finish": True}

    # The note changes make's output; double reruns, but writes the same bytes, so finish is reused.
    noted = runner.run(quick_request(parameters={"note": "hello world"}))
    assert reused(noted) == {"make": False, "double": False, "finish": True}
    assert (Path(noted.step("make").outputs["made"]) / "made.txt").read_text() == "30 hello world"

    factor = runner.run(quick_request(parameters={"factor": 4}))
    assert reused(factor) == {"make": False, "double": False, "finish": False}
    assert result_of(factor) == "result 80"


def test_an_identical_copy_of_the_code_is_reused_and_an_edited_one_reruns_every_step(
    quick_pipeline, quick_request, state, tmp_path
):
    runner, _ = quick_runner(quick_pipeline, state)
    first = runner.run(quick_request())
    copy = write_quick_pipeline(tmp_path / "copy")

    copied, _ = quick_runner(quick_pipeline, state, code_root=copy.folder)
    assert reused(copied.run(quick_request())) == {"make": True, "double": True, "finish": True}

    with (copy.folder / "job.py").open("a") as script:
        script.write("# a harmless comment\n")
    edited = copied.run(quick_request())
    assert reused(edited) == {"make": False, "double": False, "finish": False}
    assert Path(edited.step("make").log).read_text().count(f"cwd {copy.folder} ") == 1
    assert result_of(edited) == result_of(first)


def test_new_data_reruns_every_step(quick_pipeline, quick_request, state, tmp_path):
    runner, _ = quick_runner(quick_pipeline, state)
    runner.run(quick_request())
    more = tmp_path / "more"
    more.mkdir()
    (more / "batch-1.csv").write_text("1\n2\n3\n")
    (more / "batch-2.csv").write_text("4\n5\n")

    record = runner.run(quick_request(raw=more))
    assert reused(record) == {"make": False, "double": False, "finish": False}
    assert result_of(record) == "result 90"


def test_a_failing_step_stops_the_run_shows_its_log_tail_and_leaves_the_cache_intact(
    quick_pipeline, quick_request, state, tmp_path
):
    runner, progress = quick_runner(quick_pipeline, state)
    good = runner.run(quick_request())
    entries_before = cache_entries(state)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "batch-1.csv").write_text("1\nnot-a-number\n")

    with pytest.raises(LocalStepFailed) as failed:
        runner.run(quick_request(raw=bad))

    failure = failed.value
    headline, *tail = str(failure).splitlines()
    assert re.fullmatch(r"step 'make' failed with exit code 1; its log: .*/make/log\.txt", headline)
    assert any("ValueError: invalid literal for int()" in line for line in tail)
    record = runner.runs.load(failure.run_id)
    assert (record.status, record.failed_step, record.error) == (FAILED, "make", headline)
    assert {step.name: step.status for step in record.steps} == {
        "make": FAILED,
        "double": CANCELED,
        "finish": CANCELED,
    }
    assert not (state / "runs" / failure.run_id / "double").exists()  # downstream never started
    assert cache_entries(state) == entries_before
    assert not [path for path in (state / "cache").glob(f"*/{STAGING_PREFIX}*")]
    assert "make      failed after" in progress.getvalue()

    again = runner.run(quick_request())
    assert reused(again) == {"make": True, "double": True, "finish": True}
    assert again.outputs == good.outputs


def test_the_failing_steps_log_tail_is_its_last_lines(quick_pipeline, quick_request, state):
    runner, _ = quick_runner(quick_pipeline, state, log_tail_lines=2)
    with pytest.raises(LocalStepFailed) as failed:
        runner.run(quick_request(parameters={"exit_code": 3}))
    assert failed.value.step_exit_code == 3
    assert failed.value.log_tail[-1] == "finish: failing on purpose, as asked"
    assert len(failed.value.log_tail) == 2


def test_a_preempted_step_is_started_again_and_completes(quick_pipeline, quick_request, state):
    runner, progress = quick_runner(quick_pipeline, state)
    record = runner.run(quick_request(parameters={"preempt_times": 2}))

    assert record.status == COMPLETED
    assert [attempt.exit_code for attempt in record.step("double").attempts] == [75, 75, 0]
    assert [attempt.number for attempt in record.step("double").attempts] == [1, 2, 3]
    assert progress.getvalue().count("double    preempted (exit 75)") == 2
    assert result_of(record) == "result 60"


def test_preemption_restarts_are_capped(quick_pipeline, quick_request, state):
    runner, _ = quick_runner(quick_pipeline, state, max_preemption_restarts=1)
    with pytest.raises(LocalStepFailed) as failed:
        runner.run(quick_request(parameters={"preempt_times": 5}))

    assert str(failed.value).startswith(
        "step 'double' failed with exit code 75 (preempted 2 times; the cap is 1 restarts)"
    )
    record = runner.runs.load(failed.value.run_id)
    assert [attempt.exit_code for attempt in record.step("double").attempts] == [75, 75]


def test_a_forced_rerun_runs_every_step_and_never_touches_existing_entries(
    quick_pipeline, quick_request, state
):
    runner, _ = quick_runner(quick_pipeline, state)
    first = runner.run(quick_request())
    entries_before = cache_entries(state)

    forced = runner.run(quick_request(), force_rerun=True)

    assert reused(forced) == {"make": False, "double": False, "finish": False}
    assert forced.forced
    assert cache_entries(state) == entries_before
    kept = Path(forced.outputs["result"])
    assert kept.parent == state / "runs" / forced.run_id / "finish" / "outputs"
    assert (kept / "result.txt").read_text() == result_of(first)


def test_published_outputs_lose_their_write_permissions(quick_pipeline, quick_request, state):
    runner, _ = quick_runner(quick_pipeline, state)
    record = runner.run(quick_request())
    published = [path for path in (state / "cache").rglob("*") if path.is_file()]
    assert len(published) == 6  # made, doubled and result, each with its entry.json
    assert all(stat.S_IMODE(path.stat().st_mode) & 0o222 == 0 for path in published)
    assert Path(record.outputs["result"]).parent in {path.parent for path in published}


def test_a_distributed_step_runs_under_torchrun_and_reads_a_preemption_from_the_error_file(tmp_path):
    quick = write_quick_pipeline(tmp_path / "quick", distributed=True)
    state = tmp_path / "state"
    runner, _ = quick_runner(quick, state)

    request = pinned_request(
        state, quick.raw, model_name="quick", processes_per_instance=2, parameters={"preempt_times": 1}
    )
    record = runner.run(request)

    double = record.step("double")
    assert double.command[:6] == (
        sys.executable, "-m", "training.engine.torchrun_agent", "--standalone", "--nproc-per-node=2",
        f"--log-dir={state / 'runs' / record.run_id / 'double' / 'torchrun'}",
    )  # fmt: skip
    assert double.command[6:8] == ("job.py", "double")
    assert [attempt.exit_code for attempt in double.attempts] == [75, 0]  # torchrun itself exited 1
    progress = Path(double.outputs["progress"])
    started = {path.name for path in progress.glob("rank*")}
    # Both ranks ran the second launch; of the first, the rank preempted first at least (torchrun stops
    # the other, which may not have begun yet).
    assert {"rank0-attempt-2", "rank1-attempt-2"} <= started <= {
        "rank0-attempt-1", "rank0-attempt-2", "rank1-attempt-1", "rank1-attempt-2"
    }  # fmt: skip
    assert started & {"rank0-attempt-1", "rank1-attempt-1"}
    assert len(list(progress.glob("launch-*"))) == 2
    assert result_of(record) == "result 60"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"data": DataRef("rd-0123456789abcdef", "azureml:quick-raw:1")},
            r"data 'azureml:quick-raw:1': not a ",
        ),
        ({"parameters": {"factr": 4}}, r"parameters \['factr'\]: not inputs of the pipeline"),
        ({"component_versions": {"prep": "2"}}, r"component version for step 'prep': .* has no such step"),
    ],
)
def test_a_bad_request_is_refused_before_any_run_is_recorded(
    quick_pipeline, quick_request, state, change, message
):
    runner, _ = quick_runner(quick_pipeline, state)
    with pytest.raises(SubmissionError, match=message):
        runner.run(replace(quick_request(), **change))
    assert not (state / "runs").exists()


def test_a_component_version_other_than_the_yamls_is_refused(quick_request, state):
    runner = LocalRunner(RunnerOptions(state_root=state), os.environ, io.StringIO())  # the real pipeline
    request = RunRequest(model_name="digits", data=quick_request().data, component_versions={"train": "2"})
    version = load_component_spec(REPO_ROOT / "components" / "train.yml").version
    with pytest.raises(
        SubmissionError,
        match=rf"the request pins retrain_train version 2, but .*train.yml is version {version};",
    ):
        runner.run(request)
    assert not (state / "runs").exists()


def test_a_published_output_changed_afterwards_is_moved_aside_and_its_step_run_again(
    quick_pipeline, quick_request, state
):
    runner, progress = quick_runner(quick_pipeline, state)
    first = runner.run(quick_request())
    made = Path(first.step("make").outputs["made"]) / "made.txt"
    made.chmod(0o644)  # what it takes to change a published file (root needs not even that)
    made.write_text("9999")

    again = runner.run(quick_request())

    assert reused(again) == {"make": False, "double": True, "finish": True}
    assert result_of(again) == result_of(first)
    entry = made.parent.parent
    [warning] = [line for line in progress.getvalue().splitlines() if "since it was published" in line]
    assert f"cache entry {entry}: output 'made' changed since it was published (sha256 " in warning
    assert warning.endswith("running the step again") and "moved aside to" in warning
    assert (entry / "made" / "made.txt").read_text() == "30"  # the rerun published a true entry in its place


def test_a_pipeline_whose_steps_no_starter_could_fork_runs_without_one(quick_pipeline, quick_request, state):
    # Its steps are `python job.py ...`, not `python -m`: a warm starter would import torch and MLflow for
    # nothing, so none is started for the run; the default pipeline's steps all could be forked.
    runner, _ = quick_runner(quick_pipeline, state)
    launcher = runner._launcher
    assert isinstance(launcher, WarmLauncher)
    with runner.warm():
        assert launcher._starter is None
    assert runner.run(quick_request()).status == COMPLETED
    assert launcher._starter is None
    steps = load_pipeline_spec().steps.values()
    assert all(starts_as_module(step.component.command, step.distribution) for step in steps)


def test_a_previous_prepared_version_reaches_the_step_that_takes_it_and_its_content_keys_the_step(
    quick_pipeline, quick_request, state, tmp_path
):
    # `make` plays prep: an optional folder input `previous_prepared`, which no step binds.
    make = quick_pipeline.folder / "make.yml"
    make.write_text(
        make.read_text()
        .replace(
            "  note: {type: string, optional: true}\n",
            "  previous_prepared: {type: uri_folder, optional: true}\n",
        )
        .replace("$[[--note ${{inputs.note}}]]", "$[[--note ${{inputs.previous_prepared}}]]")
    )
    previous = tmp_path / "previous"
    previous.mkdir()
    (previous / "manifest.json").write_text('{"data_version": "dv-1"}')
    runner, _ = quick_runner(quick_pipeline, state)

    without = runner.run(quick_request())
    given = runner.run(quick_request(previous_prepared=str(previous)))
    again = runner.run(quick_request(previous_prepared=str(previous)))
    (previous / "manifest.json").write_text('{"data_version": "dv-2"}')  # another version, same folder
    changed = runner.run(quick_request(previous_prepared=str(previous)))

    assert "--note" not in without.step("make").command
    assert given.step("make").command[-2:] == ("--note", str(previous))
    made = Path(given.step("make").outputs["made"], "made.txt").read_text()
    assert made == f"30 {previous}"
    assert reused(without)["make"] is False and reused(given)["make"] is False
    assert reused(again)["make"] is True
    assert reused(changed)["make"] is False  # the key holds the version's content, not only its place
    assert len({run.step("make").cache_key for run in (without, given, changed)}) == 3
