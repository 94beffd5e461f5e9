"""A step forked warm (training/warm/) is the step a fresh `python -m` would have been: the same view of
its start, the same exit codes and output, its own session and random state; and its starter ends with its
runner. Driven through the local runner's own client (components/local/warm.py) and, for the fresh side,
the launcher a warm start falls back to."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from components.local.launch import SubprocessLauncher
from components.local.warm import WarmLauncher
from components.specs import REPO_ROOT

TESTS = REPO_ROOT / "tests"
PROBE = "helpers.training.warm_probe"


@pytest.fixture(scope="module")
def environ() -> dict[str, str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "WARM_PROBE_MARKER": "the step's own"}
    environ.pop("OMP_NUM_THREADS", None)
    return environ


@pytest.fixture(scope="module")
def warm(environ):
    launcher = WarmLauncher(sys.executable)
    launcher.warm_up(TESTS, environ)
    yield launcher
    launcher.close()


def _run(launcher, case: str, folder: Path, environ: dict[str, str]) -> tuple[int, dict, str]:
    folder.mkdir(parents=True, exist_ok=True)
    seen, log = folder / "seen.json", folder / "log.txt"
    process = launcher.start([sys.executable, "-m", PROBE, case, str(seen)], TESTS, environ, log)
    code = process.wait()
    return code, json.loads(seen.read_text()), log.read_text()


def test_a_warm_step_sees_its_start_as_a_fresh_one_does(warm, environ, tmp_path):
    fresh_code, fresh, fresh_log = _run(SubprocessLauncher(), "ok", tmp_path / "fresh", environ)
    warm_code, forked, warm_log = _run(warm, "ok", tmp_path / "warm", environ)
    _, again, _ = _run(warm, "ok", tmp_path / "again", environ)

    assert fresh_code == warm_code == 0
    assert sorted(warm_log.splitlines()) == sorted(fresh_log.splitlines()) == ["to stderr", "to stdout"]
    same = ("argv0_is_file", "cwd", "path0", "main", "own_session", "marker", "descriptors", "threads",
            "sigint", "sigterm", "sigpipe", "titled")  # fmt: skip
    assert {key: forked[key] for key in same} == {key: fresh[key] for key in same}
    assert forked["argv"] == ["ok", str(tmp_path / "warm" / "seen.json")]
    assert forked["own_session"] and forked["main"] == "__main__" and forked["descriptors"] == []
    assert forked["titled"]  # `ps` shows the step's command, not its starter's
    assert forked["marker"] == "the step's own" and forked["path0"] == str(TESTS)
    # Each forked step draws its own random numbers, as each fresh interpreter does.
    for generator in ("random", "numpy", "torch_seed", "torch_first"):
        assert forked[generator] != again[generator] != fresh[generator], generator


def test_a_warm_step_takes_its_thread_count_from_its_own_environment(warm, environ, tmp_path):
    _, seen, _ = _run(warm, "ok", tmp_path, {**environ, "OMP_NUM_THREADS": "1"})
    assert seen["threads"] == 1


@pytest.mark.parametrize(
    ("case", "code", "said"),
    [
        ("exit-3", 3, "to stderr"),
        ("exit-message", 1, "a message, as sys.exit says it"),
        ("raise", 1, "ValueError: raised"),
        ("interrupt", -signal.SIGINT, "to stderr"),
    ],
)
def test_a_warm_step_ends_as_an_interpreter_does(warm, environ, tmp_path, case, code, said):
    got, _, log = _run(warm, case, tmp_path, environ)
    assert got == code
    assert said in log.splitlines()[-1] or said in log


def test_a_warm_step_runs_its_exit_handlers_and_waits_for_its_threads(warm, environ, tmp_path):
    code, _, _ = _run(warm, "at-exit", tmp_path, environ)
    assert code == 0
    assert (tmp_path / "seen.atexit").read_text() == "ran"
    assert (tmp_path / "seen.thread").read_text() == "joined"


def test_a_signal_to_a_warm_step_reaches_its_process_group(warm, environ, tmp_path):
    seen = tmp_path / "seen.json"
    process = warm.start(
        [sys.executable, "-m", PROBE, "wait-for-signal", str(seen)], TESTS, environ, tmp_path / "log.txt"
    )
    # Its probe file is written before it waits: once it is there, the signal finds it waiting.
    descriptor = os.pidfd_open(process.pid)
    try:
        while not seen.exists():
            assert not _ended(descriptor), (tmp_path / "log.txt").read_text()
    finally:
        os.close(descriptor)
    # Waiting on it as on a Popen: it is paused until the signal, so it has surely not ended yet.
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait() == -signal.SIGTERM
    assert process.poll() == process.wait() == -signal.SIGTERM  # its end, reported once, is kept


def _ended(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0.05)[0])


def test_a_captured_run_gives_what_subprocess_run_gives(warm, environ, tmp_path):
    argv = [sys.executable, "-m", PROBE, "exit-3", str(tmp_path / "seen.json")]
    done = warm.run(argv, TESTS, environ, timeout=120)
    fresh = subprocess.run(argv, cwd=TESTS, env=environ, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert (done.returncode, done.stdout, done.stderr) == (3, "to stdout\n", "to stderr\n")


def test_what_a_warm_start_cannot_fork_starts_fresh(warm, environ, tmp_path):
    # Another folder, other interpreter settings, or not `python -m`: started as it is.
    log = tmp_path / "log.txt"
    assert warm.start(["/bin/sh", "-c", "exit 7"], TESTS, environ, log).wait() == 7
    elsewhere = warm.start([sys.executable, "-c", "import os; print(os.getcwd())"], tmp_path, environ, log)
    assert elsewhere.wait() == 0 and log.read_text().splitlines()[-1] == str(tmp_path)


def test_the_starter_leaves_when_its_runner_closes_it_or_dies(environ, tmp_path):
    launcher = WarmLauncher(sys.executable)
    launcher.warm_up(TESTS, environ)
    assert launcher._starter is not None
    starter = launcher._starter.process
    assert starter.poll() is None
    launcher.close()
    assert starter.poll() is not None

    # A runner that dies closes the starter's stdin: the starter leaves by itself.
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER_THAT_DIES], cwd=TESTS, env=environ, stdout=subprocess.PIPE, text=True
    )
    assert runner.stdout is not None
    starter_pid = int(runner.stdout.readline())
    descriptor = os.pidfd_open(starter_pid)
    runner.kill()
    runner.wait()
    try:
        assert select.select([descriptor], [], [], 120)[0], "the starter outlived its runner"
    finally:
        os.close(descriptor)


RUNNER_THAT_DIES = """
import sys, os
from components.local.warm import WarmLauncher
launcher = WarmLauncher(sys.executable)
launcher.warm_up(os.getcwd(), os.environ)
print(launcher._starter.process.pid, flush=True)
sys.stdin.read() if False else __import__("signal").pause()
"""


HELD = "helpers.training.held_imports"
STARTER_WITH_MODULES = (
    "import sys; from training.warm.starter import Starter; sys.exit(Starter(tuple(sys.argv[1:])).serve())"
)


def test_a_step_that_ends_while_the_starter_imports_is_reported_before_the_import_ends(environ, tmp_path):
    # The starter preloads `first`, forks a step of it, then imports `second`, which waits for the test to
    # have seen that step's end: a report held back until the import ended would never come.
    gates = {name: tmp_path / name for name in ("first", "second")}
    for gate in gates.values():
        os.mkfifo(gate)
    env = {**environ, **{f"HELD_IMPORT_{name.upper()}": str(gate) for name, gate in gates.items()}}
    modules = [f"{HELD}.first", f"{HELD}.second"]
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER_WITH_MODULES, *modules],
        cwd=TESTS, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
    )  # fmt: skip
    # Read and write, a FIFO opens without waiting for its reader; the line waits there for the import.
    released = [os.open(gate, os.O_RDWR) for gate in gates.values()]
    try:
        assert "ready" in _message(starter)
        log = str(tmp_path / "log.txt")
        request = {"id": 1, "module": modules[0], "args": [], "cwd": str(TESTS), "env": env,
                   "stdout": log, "stderr": log}  # fmt: skip
        assert starter.stdin is not None
        starter.stdin.write(json.dumps(request).encode() + b"\n")
        starter.stdin.flush()
        os.write(released[0], b"go\n")  # `first` is imported after the request is there: it starts next
        started = _message(starter)
        assert started["id"] == 1, started
        assert _message(starter) == {"pid": started["pid"], "exit": 5}  # while `second` is held
        os.write(released[1], b"go\n")
    finally:
        starter.kill()
        starter.wait()
        for descriptor in released:
            os.close(descriptor)


def test_a_starter_forks_no_step_from_code_changed_since_it_imported_it(environ, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    module = code / "stale_probe.py"
    module.write_text("import sys\n\nif __name__ == '__main__':\n    sys.exit(4)\n")
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER_WITH_MODULES, "stale_probe"],
        cwd=code, env=environ, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
    )  # fmt: skip
    log = str(tmp_path / "log.txt")

    def ask(request_id: int) -> dict:
        request = {"id": request_id, "module": "stale_probe", "args": [], "cwd": str(code), "env": environ,
                   "stdout": log, "stderr": log}  # fmt: skip
        assert starter.stdin is not None
        starter.stdin.write(json.dumps(request).encode() + b"\n")
        starter.stdin.flush()
        return _message(starter)

    try:
        assert "ready" in _message(starter)
        started = ask(1)
        assert _message(starter) == {"pid": started["pid"], "exit": 4}  # as imported: it ran
        with module.open("a") as source:
            source.write("# edited after the starter imported it\n")
        assert ask(2) == {
            "id": 2,
            "error": "stale_probe.py has changed since the starter imported it",
            "stale": True,
        }
    finally:
        starter.kill()
        starter.wait()


def _message(starter: subprocess.Popen[bytes]) -> dict:
    """The starter's next message; a failure, not a hang, if it never comes.

    The starter's stdout must be unbuffered (`bufsize=0`), so that `readline` takes one line and leaves
    the next in the pipe, where `select` sees it: a buffered reader takes every line already written, and
    a second message written before the test read the first (under load) would be waited for in vain."""
    assert starter.stdout is not None
    ready, _, _ = select.select([starter.stdout], [], [], 120)
    assert ready, "the starter said nothing in 120 s"
    return json.loads(starter.stdout.readline())
