"""A flush with the local submitter whose one step (`train`) stops once, announced, until killed; and the
entry point that runs such a flush in a fresh process (spawn: importable, not in a test file).

The step's first run writes one line into a FIFO (`started`) and then waits forever; the test reads the
FIFO, which returns only once the line is written: the step is running, with no sleep and no polling.
Every later run of the step ends at once, Completed.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from pathlib import Path

from components.local import RunnerOptions
from components.local.submitter import LocalSubmitter
from function_app.service import FrontDoor
from function_app.settings.app import AppSettings
from function_app.wiring import build_front_door

STEP_SCRIPT = textwrap.dedent(
    """\
    import os, pathlib, signal, sys
    out, gate = pathlib.Path(sys.argv[2]), pathlib.Path(os.environ["LIVENESS_GATE"])
    (out / "model.txt").write_text("partial")
    if not (gate / "stopped-once").exists():
        (gate / "stopped-once").write_text(os.environ["RETRAIN_PIPELINE_RUN"])
        with open(gate / "started", "w") as fifo:  # blocks until the test reads
            fifo.write(f"{os.getpid()}\\n")
        while True:
            signal.pause()
    (out / "model.txt").write_text("trained on " + " ".join(sorted(os.listdir(sys.argv[1]))))
    """
)

COMPONENT = """\
$schema: https://azuremlschemas.azureedge.net/latest/commandComponent.schema.json
type: command
name: liveness_train
version: "1"
code: .
environment: azureml:retrain-training:1
inputs:
  raw_data: {type: uri_folder}
outputs:
  model: {type: uri_folder}
command: >-
  python step.py ${{inputs.raw_data}} ${{outputs.model}}
"""

PIPELINE = """\
type: pipeline
experiment_name: liveness
inputs:
  raw_data: {type: uri_folder, path: azureml:liveness-raw:1}
outputs:
  model: {type: uri_folder}
jobs:
  train:
    type: command
    component: ./train.yml
    inputs:
      raw_data: ${{parent.inputs.raw_data}}
    outputs:
      model: ${{parent.outputs.model}}
"""


def gate_of(pipeline: Path) -> Path:
    """Beside the pipeline's code folder, whose every file the runner hashes (a FIFO would block it)."""
    return pipeline.parent.with_name(f"{pipeline.parent.name}-gate")


def write_pipeline(folder: Path) -> Path:
    """The one-step pipeline in `folder`, and its gate folder with the FIFO; the pipeline file."""
    folder.mkdir(parents=True)
    (folder / "step.py").write_text(STEP_SCRIPT)
    (folder / "train.yml").write_text(COMPONENT)
    (folder / "pipeline.yml").write_text(PIPELINE)
    (folder / "environment.yml").write_text("name: liveness\nversion: '1'\nimage: python:3.11\n")
    gate_of(folder / "pipeline.yml").mkdir()
    os.mkfifo(gate_of(folder / "pipeline.yml") / "started")
    return folder / "pipeline.yml"


def front_door(environ: Mapping[str, str], pipeline: Path) -> FrontDoor:
    settings = AppSettings.from_environ(environ)
    options = RunnerOptions(
        settings.home, pipeline_file=pipeline, environment_file=pipeline.parent / "environment.yml"
    )
    step_environ = {**os.environ, "LIVENESS_GATE": str(gate_of(pipeline))}
    return build_front_door(settings, environ, submitter=LocalSubmitter(options, step_environ))


def flush(environ: dict[str, str], pipeline: str) -> None:
    front_door(environ, Path(pipeline)).flush(ignore_quiet=True)
