"""One "node" of the cross-node registry race (test_registry_lock_nodes.py): a long-lived process with its
own working folder and environment, which runs the real `evaluate` and `register` entry points in-process,
as a pipeline step runs them, once per trial, when the test releases it.

The protocol, one line each way: the test sends a trial as JSON ({"evaluate": argv, "register": argv}); the
node evaluates and answers {"evaluated": exit code}; the test's "go" line releases it to register, and it
answers {"registered": exit code}. The end of its input ends it. One process serves every trial, so the
cost of importing torch and MLflow is paid once per node, not once per step.
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

from training.cli import main


def run(argv: list[str]) -> int:
    """`retrain ARGV` in this process; what it might print goes to stderr (stdout carries the protocol)."""
    protocol, sys.stdout = sys.stdout, sys.stderr
    try:
        return main(argv)
    finally:
        sys.stdout = protocol


def answer(stream: TextIO, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def serve(commands: TextIO, answers: TextIO) -> None:
    while line := commands.readline():
        trial = json.loads(line)
        answer(answers, {"evaluated": run(trial["evaluate"])})
        if commands.readline().strip() != "go":
            return
        answer(answers, {"registered": run(trial["register"])})


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
