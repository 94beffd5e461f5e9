"""The task travels through the pipeline: its options as JSON that both runners pass on unchanged, and a
user's task file, whose content is part of each local step's cache key and of the run's tags."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.components.task_file import TASK_FILE, write_task_file

from components.data_version import snapshot_folder
from components.errors import PipelineError, SubmissionError
from components.local import LocalRunner, RunnerOptions
from components.local.commands import render_command
from components.preflight import SubprocessPreflight
from components.request import COMPLETED, FAILED, DataRef, RunRequest
from components.specs import REPO_ROOT, load_component_spec
from core.task_ref import options_text

# Spaces, both quotes, braces, a glob, a dollar and a backslash: what a shell would otherwise take apart.
AWKWARD = {"note": 'it\'s a "flower" {x,y} * $HOME \\ ok', "width": 3, "sizes": [1, 2.5]}
ARGV_SCRIPT = "import json, sys\nprint(json.dumps(sys.argv[1:]))\n"


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("component", ["prep", "train", "evaluate", "register", "drift"])
def test_options_with_spaces_and_quotes_reach_every_step_unchanged_locally(component):
    spec = load_component_spec(REPO_ROOT / "components" / f"{component}.yml")
    inputs = {name: f"/in/{name}" for name in spec.inputs}
    inputs.update(task="/models/my task.py:Flowers", task_options=options_text(AWKWARD))
    argv = render_command(spec.command, inputs, {name: f"/out/{name}" for name in spec.outputs}, component)
    assert json.loads(_option(argv, "--task-options")) == AWKWARD
    assert _option(argv, "--task") == "/models/my task.py:Flowers"


def test_the_drift_check_without_a_task_leaves_it_to_the_champion_s_lineage():
    spec = load_component_spec(REPO_ROOT / "components" / "drift.yml")
    inputs = {name: None if spec.inputs[name].optional else f"/in/{name}" for name in spec.inputs}
    argv = render_command(spec.command, inputs, {"report": "/out/report"}, "drift")
    assert "--task" not in argv and "--task-options" not in argv


def _as_azure_ml_runs_it(command: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    """The command as Azure ML hands it to a shell: each ${{...}} replaced by its value as text, and each
    $[[...]] kept when its inputs are set (here: all are), without the brackets."""
    text = re.sub(r"\$\[\[(.*?)\]\]", r"\1", command)
    text = re.sub(r"\$\{\{\s*inputs\.(\w+)\s*\}\}", lambda match: inputs[match[1]], text)
    return re.sub(r"\$\{\{\s*outputs\.(\w+)\s*\}\}", lambda match: outputs[match[1]], text)


@pytest.mark.parametrize("component", ["train", "register"])
def test_the_same_options_reach_a_step_unchanged_through_a_shell_as_on_azure_ml(tmp_path, component):
    spec = load_component_spec(REPO_ROOT / "components" / f"{component}.yml")
    script = tmp_path / "argv.py"
    script.write_text(ARGV_SCRIPT)
    inputs = {name: f"/in/{name}" for name in spec.inputs}
    inputs.update(task="user_tasks/flowers_task.py:Flowers", task_options=options_text(AWKWARD))
    inputs.update(floors="accuracy=0.8", max_regression="recall_*=0.1")  # a glob, unless quoted
    command = _as_azure_ml_runs_it(spec.command, inputs, {name: f"/out/{name}" for name in spec.outputs})
    program = re.match(r"python -m [\w.]+", command)[0]
    shell_line = command.replace(program, f"{sys.executable} {script}", 1)

    done = subprocess.run(
        ["bash", "-c", shell_line], cwd=tmp_path, capture_output=True, text=True, check=True
    )

    argv = json.loads(done.stdout)
    assert json.loads(_option(argv, "--task-options")) == AWKWARD
    assert _option(argv, "--task") == "user_tasks/flowers_task.py:Flowers"
    if component == "register":
        assert _option(argv, "--max-regression") == "recall_*=0.1"


# -- through the local runner ----------------------------------------------------------------------------

SHOW_SCRIPT = """\
import json, pathlib, sys
arg = lambda flag: sys.argv[sys.argv.index(flag) + 1]
out, raw = pathlib.Path(arg("--out")), pathlib.Path(arg("--raw"))
if (raw / "edit-my-task-file.csv").exists():  # a step that changes the code it runs, while it runs
    task_file = pathlib.Path(arg("--task").rpartition(":")[0])
    task_file.write_text(task_file.read_text() + "# edited during the run\\n")
if (raw / "edit-my-task-module.csv").exists():  # ... or a module its task file imports from its folder
    module = pathlib.Path(arg("--task").rpartition(":")[0]).with_name("flower_parts.py")
    module.write_text(module.read_text() + "# edited during the run\\n")
if (raw / "append-a-row.csv").exists():  # a step that writes into its pinned raw input
    with (raw / "batch-1.csv").open("a") as batch:
        batch.write("3,4\\n")
(out / "argv.json").write_text(json.dumps(sys.argv[1:]))
(out / "raw.txt").write_text((raw / "batch-1.csv").read_text())
"""
SHOW_COMPONENT = """\
type: command
name: quick_show
version: "1"
code: .
environment: azureml:retrain-training:1
inputs:
  raw_data: {type: uri_folder}
  task: {type: string, default: tabular}
  task_options: {type: string, default: "{}"}
outputs:
  shown: {type: uri_folder}
command: >-
  python show.py --task '${{inputs.task}}' --task-options '${{inputs.task_options}}'
  --raw ${{inputs.raw_data}} --out ${{outputs.shown}}
"""
SHOW_PIPELINE = """\
type: pipeline
experiment_name: quick
inputs:
  raw_data: {type: uri_folder, path: azureml:quick-raw:1}
  task: tabular
  task_options: "{}"
outputs:
  shown: {type: uri_folder}
jobs:
  show:
    type: command
    component: ./show.yml
    inputs:
      raw_data: ${{parent.inputs.raw_data}}
      task: ${{parent.inputs.task}}
      task_options: ${{parent.inputs.task_options}}
    outputs:
      shown: ${{parent.outputs.shown}}
"""


@pytest.fixture
def show_runner(tmp_path) -> tuple[LocalRunner, Path]:
    """A one-step pipeline that records the arguments its step got, with the real preflight."""
    folder = tmp_path / "show"
    folder.mkdir()
    (folder / "show.py").write_text(SHOW_SCRIPT)
    (folder / "show.yml").write_text(SHOW_COMPONENT)
    (folder / "pipeline.yml").write_text(SHOW_PIPELINE)
    (folder / "environment.yml").write_text("name: quick\nversion: '1'\nimage: python:3.11\n")
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "batch-1.csv").write_text("a,b\n1,2\n")
    options = RunnerOptions(
        state_root=tmp_path / "state",
        pipeline_file=folder / "pipeline.yml",
        environment_file=folder / "environment.yml",
    )
    preflight = SubprocessPreflight(code_root=REPO_ROOT, environ=os.environ)  # the steps' check, for real
    return LocalRunner(options, os.environ, io.StringIO(), preflight=preflight), raw


def request_for(runner: LocalRunner, raw: Path, task_file: Path, **options) -> RunRequest:
    manifest, folder = snapshot_folder(raw, runner.options.state_root / "data" / "flowers")
    return RunRequest(
        model_name="flowers",
        data=DataRef(manifest.version, str(folder)),
        task=f"{task_file}:Flowers",
        task_options=options,
    )


def test_a_user_s_task_and_awkward_options_reach_the_local_step_unchanged(show_runner, tmp_path):
    runner, raw = show_runner
    task_file = write_task_file(tmp_path / "my models")  # a space in the path, too
    options = {"width": 3, "note": AWKWARD["note"]}

    record = runner.run(request_for(runner, raw, task_file, **options))

    assert record.status == COMPLETED
    argv = json.loads((Path(record.outputs["shown"]) / "argv.json").read_text())
    assert _option(argv, "--task") == f"{task_file}:Flowers"
    assert json.loads(_option(argv, "--task-options")) == options


def test_the_task_file_s_content_is_part_of_the_step_s_cache_key(show_runner, tmp_path):
    runner, raw = show_runner
    task_file = write_task_file(tmp_path / "models")
    first = runner.run(request_for(runner, raw, task_file))
    again = runner.run(request_for(runner, raw, task_file))
    assert (first.step("show").reused, again.step("show").reused) == (False, True)

    with task_file.open("a") as source:
        source.write("# a comment changes the file, and so the step's key\n")
    edited = runner.run(request_for(runner, raw, task_file))
    assert edited.step("show").reused is False
    assert edited.step("show").cache_key != first.step("show").cache_key


def test_a_task_file_changed_after_the_run_was_requested_is_refused_before_any_step(show_runner, tmp_path):
    runner, raw = show_runner
    task_file = write_task_file(tmp_path / "models")
    request = request_for(runner, raw, task_file)
    task_file.write_text(task_file.read_text() + "\n# edited meanwhile\n")

    with pytest.raises(SubmissionError, match=r"flowers_task.py: changed since the run was requested"):
        runner.run(request)
    assert not (runner.options.state_root / "runs").exists()


def test_the_run_s_tags_name_the_task_and_a_task_file_s_content_hash(tmp_path):
    import hashlib

    task_file = write_task_file(tmp_path)
    data = DataRef("rd-0123456789abcdef", "azureml:flowers-raw:rd-0123456789abcdef")
    tags = RunRequest(model_name="flowers", data=data, task=f"{task_file}:Flowers").tags()
    assert tags["retrain.task"] == f"{task_file}:Flowers"
    assert tags["retrain.task_sha256"] == hashlib.sha256(task_file.read_bytes()).hexdigest()
    assert RunRequest(model_name="digits", data=data).tags()["retrain.task"] == "tabular"
    assert "retrain.task_sha256" not in RunRequest(model_name="digits", data=data).tags()
    with pytest.raises(SubmissionError, match=r"job tags \['retrain.task'\]: these name the trigger"):
        RunRequest(model_name="digits", data=data, job_tags={"retrain.task": "image"})


def test_a_task_file_in_a_request_must_be_an_absolute_path_to_a_file(tmp_path):
    data = DataRef("rd-0123456789abcdef", "/data")
    with pytest.raises(SubmissionError, match=r"task 'x.py:T': expected the task file as an absolute path"):
        RunRequest(model_name="m", data=data, task="x.py:T")
    with pytest.raises(SubmissionError, match=r"task '.*gone.py:T': no file"):
        RunRequest(model_name="m", data=data, task=f"{tmp_path}/gone.py:T")
    with pytest.raises(SubmissionError, match=r"task options.note: nan is not a finite number"):
        RunRequest(model_name="m", data=data, task_options={"note": float("nan")})


# -- caches that cannot lie: the code and data a step ran on are the ones its cache key names -------------
# The steps misbehave when their raw data holds a marker file, so that the tests share one task file, one
# set of options and so one preflight check (a process that imports torch).


@pytest.fixture(scope="module")
def flowers(tmp_path_factory) -> tuple[Path, SubprocessPreflight]:
    task_file = write_task_file(tmp_path_factory.mktemp("shared-task"))
    return task_file, SubprocessPreflight(code_root=REPO_ROOT, environ=os.environ)


def _runner(show_runner, preflight: SubprocessPreflight, environ=os.environ) -> tuple[LocalRunner, Path]:
    shown, raw = show_runner
    return LocalRunner(shown.options, environ, io.StringIO(), preflight=preflight), raw


def _cache_entries(runner: LocalRunner, step: str) -> list[Path]:
    folder = runner.options.state_root / "cache" / step
    return sorted(path for path in folder.glob("[!.]*")) if folder.exists() else []


def test_a_task_file_edited_during_a_run_fails_the_run_in_one_line_and_caches_nothing(show_runner, flowers):
    task_file, preflight = flowers
    runner, raw = _runner(show_runner, preflight)
    (raw / "edit-my-task-file.csv").write_text("")
    original = task_file.read_bytes()
    before = hashlib.sha256(original).hexdigest()

    try:
        with pytest.raises(PipelineError) as failure:
            runner.run(request_for(runner, raw, task_file))
        after = hashlib.sha256(task_file.read_bytes()).hexdigest()
    finally:
        task_file.write_bytes(original)

    assert str(failure.value) == (
        f"task file {task_file}: changed during the run (sha256 {before[:12]}... when the run started, "
        f"{after[:12]}... now); the run's results are discarded, run it again"
    )
    [record] = runner.runs.list()
    assert (record.status, record.step("show").status) == (FAILED, FAILED)
    assert _cache_entries(runner, "show") == []  # nothing made by the edited code is ever reused


# A task file that imports a module beside it, which imports a package's module in a sub-folder: all three
# are the task's code. The folder also holds a module the task never imports.
FLOWER_PARTS = "from flowerlib.shapes import ROUND\nWIDTH = 8\n"


@pytest.fixture(scope="module")
def flowers_with_modules(tmp_path_factory) -> tuple[Path, SubprocessPreflight]:
    folder = tmp_path_factory.mktemp("task-with-modules")
    task_file = write_task_file(folder, text=TASK_FILE + "\nfrom flower_parts import WIDTH\n")
    write_task_file(folder, "flower_parts.py", FLOWER_PARTS)
    write_task_file(folder / "flowerlib", "__init__.py", "")
    write_task_file(folder / "flowerlib", "shapes.py", "ROUND = 1\n")
    write_task_file(folder, "notes.py", "NOT_IMPORTED = True\n")
    return task_file, SubprocessPreflight(code_root=REPO_ROOT, environ=os.environ)


def test_the_modules_a_task_file_imports_from_its_folder_are_part_of_the_step_s_cache_key(
    show_runner, flowers_with_modules
):
    task_file, preflight = flowers_with_modules
    runner, raw = _runner(show_runner, preflight)
    folder = task_file.parent
    runs = [runner.run(request_for(runner, raw, task_file)) for _ in range(2)]
    try:
        (folder / "flower_parts.py").write_text(FLOWER_PARTS + "WIDTH = 0\n")  # the task file is unchanged
        runs.append(runner.run(request_for(runner, raw, task_file)))
        (folder / "notes.py").write_text("NOT_IMPORTED = False\n")  # not the task's code
        runs.append(runner.run(request_for(runner, raw, task_file)))
    finally:
        (folder / "flower_parts.py").write_text(FLOWER_PARTS)

    assert [run.step("show").reused for run in runs] == [False, True, False, True]
    assert runs[2].step("show").cache_key != runs[0].step("show").cache_key
    # The hash the step's key holds is the one core/sources.py gives a step, for lineage and its checks.
    from core.sources import task_sources_sha256
    from core.task_ref import parse_task_ref

    # The sub-folder's package, which the module imports, is the task's code too (tests/core/test_sources.py).
    entry = json.loads((Path(runs[0].outputs["shown"]).parent / "entry.json").read_text())
    hashed = task_sources_sha256(parse_task_ref(f"{task_file}:Flowers"), [])  # the files, restored
    assert entry["material"]["task_file_sha256"] == hashed.sha256
    assert sorted(hashed.hashes) == [
        "flower_parts.py",
        "flowerlib/__init__.py",
        "flowerlib/shapes.py",
        "flowers_task.py",
    ]


def test_a_module_a_task_file_imports_edited_during_a_run_fails_the_run_and_caches_nothing(
    show_runner, flowers_with_modules
):
    task_file, preflight = flowers_with_modules
    runner, raw = _runner(show_runner, preflight)
    (raw / "edit-my-task-module.csv").write_text("")
    module = task_file.with_name("flower_parts.py")
    before = hashlib.sha256(module.read_bytes()).hexdigest()

    try:
        with pytest.raises(PipelineError) as failure:
            runner.run(request_for(runner, raw, task_file))
        after = hashlib.sha256(module.read_bytes()).hexdigest()
    finally:
        module.write_text(FLOWER_PARTS)

    assert str(failure.value) == (
        f"task file {task_file}: {module}: changed during the run (sha256 {before[:12]}... when the run "
        f"started, {after[:12]}... now); the run's results are discarded, run it again"
    )
    [record] = runner.runs.list()
    assert (record.status, record.step("show").status) == (FAILED, FAILED)
    assert _cache_entries(runner, "show") == []


def test_a_step_writing_into_its_pinned_raw_data_fails_and_a_damaged_version_is_refused(show_runner, flowers):
    task_file, preflight = flowers
    runner, raw = _runner(show_runner, preflight)
    (raw / "append-a-row.csv").write_text("")
    request = request_for(runner, raw, task_file)
    pinned = Path(request.data.uri) / "batch-1.csv"
    assert stat.S_IMODE(pinned.stat().st_mode) == 0o444  # published read-only

    # Refused by the file's mode, or (as root, whom modes do not stop) found changed when the step ends.
    with pytest.raises(PipelineError, match=r"step 'show' (failed|changed its input 'raw_data')"):
        runner.run(request)
    assert _cache_entries(runner, "show") == []

    pinned.chmod(0o644)
    pinned.write_text("a,b\n1,2\n3,4\n")  # however it happened, the pinned copy no longer is the version
    with pytest.raises(PipelineError) as refused:
        runner.run(request)
    assert str(refused.value).startswith(
        f"pinned data version {request.data.version} in {request.data.uri}: batch-1.csv changed since it "
        "was pinned (sha256 "
    )
    assert len(runner.runs.list()) == 1  # refused before any step

    (raw / "append-a-row.csv").unlink()
    healed = runner.run(request_for(runner, raw, task_file))  # pinned again, from its unchanged source
    assert (Path(healed.outputs["shown"]) / "raw.txt").read_text() == "a,b\n1,2\n"


def test_a_module_task_s_source_files_are_part_of_the_step_s_cache_key(show_runner, tmp_path):
    site = tmp_path / "site"
    package = site / "flowerpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text(TASK_FILE)
    (package / "helpers.py").write_text("WIDTH = 8\n")
    environ = {**os.environ, "PYTHONPATH": str(site)}
    runner, raw = _runner(show_runner, SubprocessPreflight(code_root=REPO_ROOT, environ=environ), environ)
    manifest, folder = snapshot_folder(raw, runner.options.state_root / "data" / "flowers")
    request = RunRequest(
        model_name="flowers", data=DataRef(manifest.version, str(folder)), task="flowerpkg.task:Flowers"
    )

    first, again = runner.run(request), runner.run(request)
    (package / "helpers.py").write_text("WIDTH = 9\n")  # a module of the task's package, not the task's own
    edited = runner.run(request)

    assert [run.step("show").reused for run in (first, again, edited)] == [False, True, False]
    assert edited.step("show").cache_key != first.step("show").cache_key
    # The hash the step's key holds is the one a step computes for lineage, where the task is imported.
    from core.sources import module_sources_sha256

    entry = json.loads((Path(edited.outputs["shown"]).parent / "entry.json").read_text())
    assert entry["material"]["task_code_sha256"] == module_sources_sha256("flowerpkg.task", [str(site)])
