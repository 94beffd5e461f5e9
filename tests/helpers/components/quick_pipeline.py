"""A small pipeline of quick steps for the local runner's tests (the `quick_pipeline` fixture writes one).

It is made of real component YAMLs whose commands run a real Python script (`job.py` below) in real
processes; it exercises the runner's reuse, failure, preemption and signal handling in a fraction of a
second per step. The real pipeline (components/pipeline.yml) is run by test_local_pipeline.py with a small
training.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from components.request import RunRequest

JOB_SCRIPT = '''
"""Quick steps for the runner's tests: each reads its inputs, writes its outputs, and can misbehave."""
import argparse, os, pathlib, signal, sys, time

parser = argparse.ArgumentParser()
parser.add_argument("action")
parser.add_argument("--raw")
parser.add_argument("--made")
parser.add_argument("--doubled")
parser.add_argument("--factor", type=int, default=1)
parser.add_argument("--note")
parser.add_argument("--progress")
parser.add_argument("--preempt-times", type=int, default=0)
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--wait-for-signal", type=int, default=0)
parser.add_argument("--out", required=True)
args = parser.parse_args()
out = pathlib.Path(args.out)
print(f"{args.action}: cwd {os.getcwd()} home {os.environ.get('RETRAIN_HOME')} python {sys.executable}")
sys.stdout.flush()

if args.action == "make":
    files = sorted(pathlib.Path(args.raw).iterdir())
    numbers = [int(word) for path in files for word in path.read_text().split()]
    text = str(sum(numbers) * args.factor) + (f" {args.note}" if args.note else "")
    (out / "made.txt").write_text(text)
elif args.action == "double":
    rank = os.environ.get("RANK", "0")
    progress = pathlib.Path(args.progress)
    # The attempt is torchrun's launch, named by its run id (without torchrun, the process): a rank that
    # torchrun stopped before it began (another rank was preempted first) must not count the next launch
    # as its own first.
    (progress / f"launch-{os.environ.get('TORCHELASTIC_RUN_ID') or os.getpid()}").touch()
    attempt = len(list(progress.glob("launch-*")))
    (progress / f"rank{rank}-attempt-{attempt}").write_text("started")
    if attempt <= args.preempt_times:
        print(f"rank {rank} attempt {attempt}: preempted, state saved")
        error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if error_file:  # torchelastic's error-file protocol, as training.engine.worker reports a preemption
            pathlib.Path(error_file).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(error_file).write_text('{"message": {"message": "preempted", "errorCode": 75}}')
        sys.exit(75)
    if rank == "0":
        value = int(pathlib.Path(args.made, "made.txt").read_text().split()[0])
        (out / "doubled.txt").write_text(str(2 * value))
elif args.action == "finish":
    if args.wait_for_signal:
        received = []
        signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
        signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
        print("ready: waiting for a stop signal")
        sys.stdout.flush()
        while not received:
            signal.pause()
        print(f"received {signal.Signals(received[0]).name}: state saved")
        sys.exit(75)
    if args.exit_code:
        print("finish: failing on purpose, as asked")
        sys.exit(args.exit_code)
    doubled = pathlib.Path(args.doubled, "doubled.txt").read_text()
    (out / "result.txt").write_text(f"result {doubled}")
'''


def _component(name: str, inputs: str, outputs: str, command: str, distribution: str = "") -> str:
    return (
        textwrap.dedent(
            f"""\
        $schema: https://azuremlschemas.azureedge.net/latest/commandComponent.schema.json
        type: command
        name: quick_{name}
        version: "1"
        code: .
        environment: azureml:retrain-training:1
        """
        )
        + f"inputs:\n{inputs}outputs:\n{outputs}{distribution}command: >-\n  {command}\n"
    )


QUICK_COMPONENTS = {
    "make.yml": _component(
        "make",
        "  raw_data: {type: uri_folder}\n  factor: {type: integer, default: 1}\n"
        "  note: {type: string, optional: true}\n",
        "  made: {type: uri_folder}\n",
        "python job.py make --raw ${{inputs.raw_data}} --factor ${{inputs.factor}} --out ${{outputs.made}} "
        "$[[--note ${{inputs.note}}]]",
    ),
    "double.yml": _component(
        "double",
        "  made: {type: uri_folder}\n  preempt_times: {type: integer, default: 0}\n",
        "  doubled: {type: uri_folder}\n  progress: {type: uri_folder, mode: rw_mount}\n",
        "python job.py double --made ${{inputs.made}} --progress ${{outputs.progress}} "
        "--preempt-times ${{inputs.preempt_times}} --out ${{outputs.doubled}}",
    ),
    "finish.yml": _component(
        "finish",
        "  doubled: {type: uri_folder}\n  exit_code: {type: integer, default: 0}\n"
        "  wait_for_signal: {type: integer, default: 0}\n",
        "  result: {type: uri_folder}\n",
        "python job.py finish --doubled ${{inputs.doubled}} --exit-code ${{inputs.exit_code}} "
        "--wait-for-signal ${{inputs.wait_for_signal}} --out ${{outputs.result}}",
    ),
}


_QUICK_PIPELINE = """\
type: pipeline
experiment_name: quick
inputs:
  raw_data: {type: uri_folder, path: azureml:quick-raw:1}
  factor: 3
outputs:
  result: {type: uri_folder}
jobs:
  make:
    type: command
    component: ./make.yml
    inputs:
      raw_data: ${{parent.inputs.raw_data}}
      factor: ${{parent.inputs.factor}}
  double:
    type: command
    component: ./double.yml
    # distribution
    inputs:
      made: ${{parent.jobs.make.outputs.made}}
    outputs:
      progress: {type: uri_folder, mode: rw_mount, path: azureml://datastores/x/paths/progress/}
  finish:
    type: command
    component: ./finish.yml
    inputs:
      doubled: ${{parent.jobs.double.outputs.doubled}}
    outputs:
      result: ${{parent.outputs.result}}
"""


def _quick_pipeline_yaml(distributed: bool) -> str:
    if not distributed:
        return _QUICK_PIPELINE
    return _QUICK_PIPELINE.replace(
        "# distribution", "distribution: {type: pytorch, process_count_per_instance: 1}"
    )


@dataclass(frozen=True)
class QuickPipeline:
    """A pipeline of quick steps (make -> double -> finish) in its own code folder, and raw numbers."""

    folder: Path
    raw: Path

    @property
    def pipeline_file(self) -> Path:
        return self.folder / "pipeline.yml"

    @property
    def environment_file(self) -> Path:
        return self.folder / "environment.yml"


def write_quick_pipeline(folder: Path, distributed: bool = False) -> QuickPipeline:
    folder.mkdir(parents=True)
    (folder / "job.py").write_text(JOB_SCRIPT)
    for name, text in QUICK_COMPONENTS.items():
        (folder / name).write_text(text)
    (folder / "pipeline.yml").write_text(_quick_pipeline_yaml(distributed))
    (folder / "environment.yml").write_text("name: quick\nversion: '1'\nimage: python:3.11\n")
    raw = folder.parent / f"{folder.name}-raw"
    raw.mkdir()
    (raw / "batch-1.csv").write_text("1\n2\n3\n")
    (raw / "batch-2.csv").write_text("4\n")
    return QuickPipeline(folder, raw)


# A function that pins the quick pipeline's raw numbers (or another folder) as a run request.
QuickRequest = Callable[..., RunRequest]
