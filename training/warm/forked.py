"""A child process that is `python -m MODULE ARGS`, forked from this interpreter instead of exec'd anew.

`ForkedProcess` has the part of `subprocess.Popen`'s interface that the local runner's starter and
torchrun's agent use (pid, poll, wait, send_signal, terminate, kill, returncode). In the child,
`_become` does what exec and a fresh interpreter's start and end would have done, so that a module cannot
tell the difference:

- its own session (as `start_new_session=True`; or its parent's, as torchrun's agent is its launcher's),
  its standard streams on the given files, every other descriptor this process holds closed (an exec'd
  child inherits none: Python opens them close-on-exec);
- the step's working folder and environment; `sys.path[0]` the working folder, as `python -m` makes it;
  its command line as its process title, where setproctitle is installed;
- the signal dispositions a fresh interpreter starts with (SIGINT raises KeyboardInterrupt, SIGPIPE
  ignored, the rest default), and no wakeup descriptor;
- fresh random state: Python's `random` reseeds itself after a fork, and numpy's and torch's global
  generators are reseeded here from the OS, as each is at its import; torch's thread count follows the
  step's OMP_NUM_THREADS (OpenMP read the starter's at import);
- none of the starter's objects is ever collected here (`gc.freeze`), and their `weakref.finalize`
  finalisers are detached, so nothing of theirs acts on the parent's files (its temporary folders) or on
  a descriptor number the child has reused;
- at the end, what an interpreter does before it exits: `SystemExit`'s code (None is 0, a message is
  printed and is 1), an uncaught exception's traceback and 1, an uncaught KeyboardInterrupt ends the
  process by SIGINT; then non-daemon threads are joined, atexit handlers run and the streams flushed.

The starter must not have initialised CUDA or started threads of its own before it forks: a forked child
inherits only the forking thread, and CUDA cannot be used in a child forked after it was initialised.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import os
import runpy
import select
import shlex
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Mapping, Sequence
from typing import IO, Any

_Stream = IO[Any] | int | None  # a file object, a descriptor, or None: inherit this process's


def module_command(argv: Sequence[str], python: str = sys.executable) -> tuple[str, list[str], bool] | None:
    """`(module, args, unbuffered)` when `argv` is `python [-u] -m MODULE ARGS...` run by this interpreter;
    None for anything else, which must be exec'd as it is."""
    if len(argv) < 3 or argv[0] != python:
        return None
    rest, unbuffered = list(argv[1:]), False
    if rest[0] == "-u":
        rest, unbuffered = rest[1:], True
    if len(rest) < 2 or rest[0] != "-m" or rest[1].startswith("-"):
        return None
    return rest[1], rest[2:], unbuffered


class ForkedProcess:
    """`python -m module args`, forked from this interpreter: a real child, waited for like one."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        stdin: _Stream = None,
        stdout: _Stream = None,
        stderr: _Stream = None,
        unbuffered: bool = False,
        close_in_child: Sequence[int] = (),
        new_session: bool = True,
        forget_modules: Sequence[str] = (),
    ) -> None:
        self.args = [sys.executable, *(["-u"] if unbuffered else []), "-m", module, *args]
        self.returncode: int | None = None
        descriptors = [_descriptor(stream) for stream in (stdin, stdout, stderr)]
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                forget = (module, *forget_modules)
                code = _become(
                    forget, list(args), dict(env), cwd, descriptors, unbuffered, close_in_child, new_session
                )
            finally:
                os._exit(code)
        self.pid = pid

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it has ended, how is unknown
                self.returncode = 255
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        if timeout is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.returncode = 255
            return self.returncode
        # A pidfd becomes readable when the process ends: wait on it, not on a polling loop.
        descriptor = os.pidfd_open(self.pid)
        try:
            ready, _, _ = select.select([descriptor], [], [], timeout)
        finally:
            os.close(descriptor)
        code = self.poll()
        if not ready or code is None:
            import subprocess

            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended between the poll and the signal
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _descriptor(stream: _Stream) -> int | None:
    if stream is None or isinstance(stream, int):
        return stream
    stream.flush()
    return stream.fileno()


def _become(
    modules: Sequence[str],
    args: list[str],
    env: dict[str, str],
    cwd: str,
    descriptors: list[int | None],
    unbuffered: bool,
    close_in_child: Sequence[int],
    new_session: bool,
) -> int:
    """Run `modules[0]` as `python -m` would, in this freshly forked child; its exit code. The modules
    named are forgotten first, to be imported afresh: the one run (a fresh interpreter has not imported the
    module it runs as __main__) and any the caller names (a user's task its launcher loaded)."""
    module = modules[0]
    # The starter's objects are never collected here: a finaliser of one of them (a file closed in a
    # cycle's __del__) must not act on a descriptor number this process has since reused.
    gc.freeze()
    # Nor are their finalisers run at this process's exit: the parent's temporary folder (its launcher's
    # report folder) is the parent's to remove. The child's own are run, as an interpreter runs them.
    for finaliser in list(weakref.finalize._registry):  # type: ignore[attr-defined]
        finaliser.detach()
    try:
        if new_session:
            os.setsid()
        for target, descriptor in enumerate(descriptors):
            if descriptor is not None and descriptor != target:
                os.dup2(descriptor, target)  # dup2's copy is inheritable, as a standard stream is
        _close_other_descriptors(close_in_child)
        # Before the environment changes: setproctitle finds the memory it rewrites from the environment's.
        _title([sys.executable, *(["-u"] if unbuffered else []), "-m", module, *args])
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        _fresh_signals()
        _fresh_streams(unbuffered)
        _fresh_libraries(env)
        sys.path[0] = os.getcwd()
    except BaseException:  # cannot become the step: say why, as a failed exec would
        traceback.print_exc()
        return 1
    for name in modules:
        sys.modules.pop(name, None)
    sys.argv = [module, *args]  # runpy puts the module's file first
    code = _run(module)
    _shut_down()
    return code


def _title(argv: list[str]) -> None:
    """Show the step's own command line (`ps`, /proc/PID/cmdline), not its parent's, where setproctitle
    is installed (the local environment, requirements-dev.txt)."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(shlex.join(argv))


def _close_other_descriptors(extra: Sequence[int]) -> None:
    """Close what exec would have: every descriptor but the standard three that is close-on-exec (all
    that Python opens), and `extra`."""
    try:
        open_now = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        open_now = list(extra)
    for descriptor in open_now:
        if descriptor < 3:
            continue
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone with it
            if descriptor in extra or not os.get_inheritable(descriptor):
                os.close(descriptor)


def _fresh_signals() -> None:
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            continue  # signals Python may not touch
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python's start-up leaves it
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _fresh_streams(unbuffered: bool) -> None:
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=sys.stdin.encoding)
    for number, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(number, "w", closefd=False)
        binary: io.RawIOBase | io.BufferedWriter = raw if unbuffered else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            binary,  # type: ignore[arg-type]
            encoding=getattr(sys, name).encoding,
            errors="backslashreplace" if name == "stderr" else "strict",
            line_buffering=name == "stderr" or os.isatty(number),
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.__stdin__ = sys.stdin


def _fresh_libraries(env: Mapping[str, str]) -> None:
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # from the OS, as at numpy's import
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()  # from the OS, as at torch's import
        threads = env.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))


def _run(module: str) -> int:
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as leaving:
        return _exit_code(leaving.code)
    except KeyboardInterrupt:
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # ended by SIGINT, as an interpreter ends on one
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _shut_down() -> None:
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads, as at exit
    except BaseException:
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    _flush()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing more to say
            stream.flush()
