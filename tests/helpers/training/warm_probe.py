"""A module run as `python -m helpers.training.warm_probe CASE OUT`, fresh or forked warm: it writes
what it can see of its own start (argv, folder, path, session, environment, descriptors, random state) to
OUT as JSON, then ends as CASE says, so a test can hold a warm start to a fresh one."""

from __future__ import annotations

import atexit
import json
import os
import random
import signal
import sys
import threading
from pathlib import Path


def _seen() -> dict:
    import numpy
    import torch

    return {
        "argv": sys.argv[1:],
        "argv0_is_file": Path(sys.argv[0]).name == "warm_probe.py",
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "main": __name__,
        "own_session": os.getsid(0) == os.getpid(),
        "marker": os.environ.get("WARM_PROBE_MARKER"),
        "descriptors": sorted(int(name) for name in os.listdir("/proc/self/fd") if int(name) > 2),
        "random": random.random(),
        "numpy": float(numpy.random.random()),
        "torch_seed": torch.initial_seed(),
        "torch_first": float(torch.rand(1)),
        "threads": torch.get_num_threads(),
        "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "sigpipe": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
        "titled": "-m helpers.training.warm_probe"
        in Path("/proc/self/cmdline").read_text().replace("\0", " "),
    }


def main() -> None:
    case, out = sys.argv[1], Path(sys.argv[2])
    seen = _seen()
    seen["descriptors"] = [d for d in seen["descriptors"] if d != 3]  # the listing's own, if it was 3
    out.write_text(json.dumps(seen))
    print("to stdout")
    print("to stderr", file=sys.stderr)
    if case == "exit-3":
        sys.exit(3)
    if case == "exit-message":
        sys.exit("a message, as sys.exit says it")
    if case == "raise":
        raise ValueError("raised")
    if case == "interrupt":
        raise KeyboardInterrupt
    if case == "at-exit":
        done = out.with_suffix(".atexit")
        atexit.register(lambda: done.write_text("ran"))

        def late() -> None:  # a non-daemon thread: the interpreter waits for it before it exits
            out.with_suffix(".thread").write_text("joined")

        threading.Timer(0.2, late).start()
    if case == "wait-for-signal":
        signal.pause()


if __name__ == "__main__":
    main()
