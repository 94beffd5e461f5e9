"""The drift check as the demo runs it: the `drift` component's own command (`retrain drift`), in this
process, with the demo's environment (its MLflow store, and the loopback topic to publish to)."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from demo.narration import Narrator
from training.drift import cli as drift_cli


def run_drift_check(
    home: Path, current: Path, model_name: str, environ: Mapping[str, str], say: Narrator
) -> dict[str, Any]:
    """Run the check on `current` against the champion's data; returns its drift.json with `out`, the
    folder of the report and its chart."""
    parser = argparse.ArgumentParser(prog="retrain")
    drift_cli.add_commands(parser.add_subparsers(dest="command", required=True))
    out = home / "drift" / "check"
    argv = ["drift", "--model-name", model_name, "--current", str(current), "--out", str(out)]
    args = parser.parse_args(argv)
    args.environ, args.state_root = dict(environ), home
    printed = io.StringIO()
    args.handler(args, printed)
    for line in printed.getvalue().splitlines():
        say.line(line)
    report = json.loads((out / drift_cli.REPORT_FILE).read_text())
    return {**report, "out": str(out)}
