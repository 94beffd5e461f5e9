"""training/warm/torch_patches.py: each change to torch's own code still fits the torch it is made to.

Fails loudly when torch changes under a patch: a torch version none of the patches was tested on, a
target gone or renamed, a signature changed, torch calling a target another way or using more of its
result than the patch provides, or a patch no longer answering as the code it replaces.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from training.warm.forked import ForkedProcess
from training.warm.torch_patches import (
    PATCHES,
    RENDEZVOUS_METHOD_NAME,
    SUBPROCESS_POPEN,
    TorchPatch,
    method_name,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
ELASTIC = Path(inspect.getfile(dynamic_rendezvous)).parents[1]  # torch/distributed/elastic


def _target(patch: TorchPatch) -> object:
    module, _, path = patch.target.partition(":")
    found: object = importlib.import_module(module)
    for name in path.split("."):
        found = getattr(found, name)
    return found


@pytest.mark.parametrize("patch", PATCHES, ids=lambda patch: patch.target.rpartition(":")[2])
def test_torch_is_a_version_the_patch_was_tested_on_and_its_target_is_there(patch):
    version = torch.__version__.partition("+")[0]  # 2.13.0+cpu, 2.13.0+cu128: the same torch code
    assert version in patch.tested_on, (
        f"torch {torch.__version__} is not among the versions {patch.target} was tested on "
        f"{patch.tested_on}: read the target again, then add this version (training/warm/torch_patches.py)"
    )
    assert callable(_target(patch))


def test_torchrun_still_starts_a_worker_through_popen_given_args_and_env_after_opening_its_outputs():
    popen = _target(SUBPROCESS_POPEN)
    assert list(inspect.signature(popen).parameters) == ["self", "args", "env"]
    init = inspect.getsource(subprocess_handler.SubprocessHandler.__init__)
    # The patch forks onto the handler's output files: they must be open when _popen is called.
    opened = max(init.index("self._stdout = "), init.index("self._stderr = "))
    assert opened < init.index("self.proc: Popen = self._popen(args_str, env_vars)")


def test_torchrun_uses_no_more_of_a_workers_process_than_a_forked_one_has():
    used = set()
    for source in ELASTIC.rglob("*.py"):
        used |= set(re.findall(r"\.proc\.(\w+)", source.read_text()))
    assert used == {"pid", "poll", "wait", "send_signal"}
    assert all(callable(getattr(ForkedProcess, name)) for name in used - {"pid"})


FORKED_BY_TORCHRUN = """
import json, os, sys
from torch.distributed.elastic.multiprocessing.subprocess_handler import get_subprocess_handler
from training.warm.torch_patches import fork_workers

fork_workers()
out, stdout, stderr = sys.argv[1:]
module = get_subprocess_handler(sys.executable, ("-u", "-m", "helpers.training.warm_probe", "ok", out),
                                {"WARM_PROBE_MARKER": "rank 0"}, stdout, stderr, 0)
other = get_subprocess_handler(sys.executable, ("-c", "pass"), {}, os.devnull, os.devnull, 1)
print(json.dumps({"module": [type(module.proc).__name__, module.proc.wait()],
                  "other": [type(other.proc).__name__, other.proc.wait()]}))
"""


def test_a_patched_torchrun_forks_a_python_m_worker_into_a_session_of_its_own_and_execs_anything_else(
    tmp_path,
):
    out, stdout, stderr = tmp_path / "seen.json", tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    environ = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO_ROOT}:{REPO_ROOT / 'tests'}"}
    done = subprocess.run(
        [sys.executable, "-c", FORKED_BY_TORCHRUN, str(out), str(stdout), str(stderr)],
        cwd=REPO_ROOT / "tests",
        env=environ,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"module": ["ForkedProcess", 0], "other": ["Popen", 0]}
    seen = json.loads(out.read_text())
    # torchrun ends a worker by signalling its process group (SubprocessHandler.close): it must lead one.
    assert seen["own_session"] and seen["marker"] == "rank 0"
    assert (stdout.read_text(), stderr.read_text()) == ("to stdout\n", "to stderr\n")  # torchrun's files


def test_the_rendezvous_still_asks_its_module_global_for_the_callers_name():
    parameters = inspect.signature(_target(RENDEZVOUS_METHOD_NAME)).parameters
    assert [(name, parameter.default) for name, parameter in parameters.items()] == [("depth", 2)]
    tree = ast.parse(inspect.getsource(dynamic_rendezvous))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "get_method_name"
    ]
    assert calls and all(not node.args and not node.keywords for node in calls)  # looked up at each call


def test_the_cheap_name_is_the_one_torch_would_have_given():
    original = dynamic_rendezvous.get_method_name  # never patched in this process: only a warm agent does

    def recorded_by(name_of):  # as the rendezvous's event records call it, two frames below the caller
        return name_of()

    def caller_of_the_record(name_of):
        return recorded_by(name_of)

    assert caller_of_the_record(method_name) == caller_of_the_record(original) == "caller_of_the_record"
    assert method_name(10_000) == original(10_000) == "no_method_name"
