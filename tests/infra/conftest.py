"""The functions the Functions worker indexes, by name with their trigger type, read in a child process:
`FunctionApp.get_functions()` may be called once per process, and tests/function_app/ calls it in its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
_INDEX = """
import json, function_entry
functions = function_entry.app.get_functions()
print(json.dumps({f.get_function_name(): f.get_trigger().get_binding_name() for f in functions}))
"""


@pytest.fixture(scope="session")
def indexed_functions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("infra-entry")
    environ = {"RETRAIN_SUBMITTER": "dry-run", "RETRAIN_HOME": str(home), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", _INDEX],
        cwd=REPO_ROOT,
        env={**environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])
