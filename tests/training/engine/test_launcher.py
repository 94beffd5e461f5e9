"""The launcher of a multi-process run only watches torchrun: it must not pay for importing torch."""

from __future__ import annotations

import subprocess
import sys


def test_the_launcher_and_the_cli_import_no_torch():
    # Each multi-process launch would otherwise spend seconds importing torch before torchrun even starts.
    probe = (
        "import sys, training.cli, training.engine.launch; "
        "print(sorted({'torch', 'mlflow'} & set(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
