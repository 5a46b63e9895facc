# mypy: disable-error-code="func-returns-value"
"""Job types that misbehave on purpose (load with ``--import tests.support.hostile_jobtypes``).

The runner processes of ``tests/unit/runner/test_hostile_jobs.py`` import it.

* ``hostile`` {"how": str, "arg"?: any}: does what ``how`` names (see :data:`HOWS`), then returns
  ``{"pid": its runner's pid}`` unless that thing ended the job first.
* ``probe`` {}: a well-behaved job that reports the process state a misbehaving one could have
  changed: ``{"pid", "cwd", "umask", "env", "path0", "sigterm", "sigalrm", "nofile", "alarm",
  "stdout", "sum"}``.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import fcntl
import json
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from runner.registry import JobContext, JobType, register

MARK = "CORRAL_HOSTILE_MARK"
"""The environment variable a hostile job sets (a later job must not see it)."""


class _Custom(BaseException):
    """A BaseException that is not an Exception."""


def _pipe_fds() -> list[int]:
    """This process's descriptors above 2 that are pipes (the runner's two, and any a job made)."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                fds.append(fd)
        except OSError:
            continue
    return fds


def _answer_pipes() -> list[int]:
    """The write ends among this process's pipes: the runner's answer pipe, wherever it was moved."""
    return [fd for fd in _pipe_fds() if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY]


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _runner_out_fd() -> int:
    """The runner's answer pipe as it was given: its ``--out`` argument."""
    argv = sys.argv
    return int(argv[argv.index("--out") + 1])


def _runner_in_fd() -> int:
    argv = sys.argv
    return int(argv[argv.index("--in") + 1])


def _forever() -> None:
    while True:
        time.sleep(0.05)


def _recurse(n: int) -> int:
    return _recurse(n + 1) + 1


def _fork_child_returns() -> None:
    """Fork; the child returns from the job as if it were the runner (then the parent waits for it)."""
    pid = os.fork()
    if pid == 0:
        return  # the child goes on as a copy of the runner
    os.waitpid(pid, 0)


def _fork_child_raises_exit() -> None:
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # SystemExit in a copy of the runner
    os.waitpid(pid, 0)


HOWS: dict[str, Callable[[Any], object]] = {
    "exit0": lambda arg: os._exit(0),
    "exit3": lambda arg: os._exit(3),
    "sys_exit": lambda arg: sys.exit(arg if arg is not None else 0),
    "keyboard_interrupt": lambda arg: (_ for _ in ()).throw(KeyboardInterrupt("ctrl-c")),
    "base_exception": lambda arg: (_ for _ in ()).throw(_Custom("custom")),
    "generator_exit": lambda arg: (_ for _ in ()).throw(GeneratorExit()),
    "close_std": lambda arg: [os.close(fd) for fd in (0, 1, 2)],
    "dup2_std": lambda arg: [os.dup2(os.open(os.devnull, os.O_RDWR), fd) for fd in (0, 1, 2)],
    "close_pipes": lambda arg: [_close(fd) for fd in (_runner_in_fd(), _runner_out_fd())],
    "close_out": lambda arg: _close(_runner_out_fd()),
    "close_in": lambda arg: _close(_runner_in_fd()),
    "closerange": lambda arg: os.closerange(3, 4096),
    "dup2_out": lambda arg: os.dup2(os.open(os.devnull, os.O_WRONLY), _runner_out_fd()),
    "dup2_in": lambda arg: os.dup2(os.open(os.devnull, os.O_RDONLY), _runner_in_fd()),
    "garbage_std": lambda arg: (os.write(1, os.urandom(4096)), os.write(2, b"\x00\xff garbage\n")),
    "garbage_pipe": lambda arg: [os.write(fd, (arg or "garbage!\n").encode()) for fd in _answer_pipes()],
    "chdir": lambda arg: os.chdir(arg or "/"),
    "umask": lambda arg: os.umask(0o777),
    "environ": lambda arg: (os.environ.__setitem__(MARK, "1"), os.environ.pop("PATH", None)),
    "sys_path": lambda arg: sys.path.insert(0, "/nonexistent-hostile"),
    "sigterm_ignore": lambda arg: signal.signal(signal.SIGTERM, signal.SIG_IGN),
    "alarm": lambda arg: signal.alarm(int(arg or 1)),
    "sigalrm_handler": lambda arg: (
        signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(RuntimeError("stale alarm"))),
        signal.setitimer(signal.ITIMER_REAL, float(arg or 0.5)),
    ),
    "nofile": lambda arg: resource.setrlimit(resource.RLIMIT_NOFILE, (int(arg or 12), int(arg or 12))),
    "nofile_soft": lambda arg: resource.setrlimit(
        resource.RLIMIT_NOFILE, (int(arg or 12), resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    ),
    "nproc": lambda arg: resource.setrlimit(resource.RLIMIT_NPROC, (1, 1)),
    "thread_forever": lambda arg: threading.Thread(target=_forever, daemon=bool(arg)).start(),
    "daemon_child": lambda arg: os.fork() or (time.sleep(60), os._exit(0)),
    "fork_exit_child": lambda arg: (lambda pid: os.waitpid(pid, 0) if pid else os._exit(0))(os.fork()),
    "fork_child_returns": lambda arg: _fork_child_returns(),
    "fork_child_sys_exit": lambda arg: _fork_child_raises_exit(),
    "fork_bomb": lambda arg: [os.fork() or (time.sleep(60), os._exit(0)) for _ in range(int(arg or 20))],
    "memory": lambda arg: [bytearray(1 << 20) for _ in range(1 << 16)],
    "memory_caught": lambda arg: _eat_memory_caught(),
    "segfault": lambda arg: ctypes.string_at(0),
    "stack_overflow": lambda arg: (sys.setrecursionlimit(10**7), _recurse(0)),
    "recursion_error": lambda arg: _recurse(0),
    "stdout_none": lambda arg: (setattr(sys, "stdout", None), setattr(sys, "stderr", None)),
    "stdout_broken": lambda arg: setattr(sys, "stdout", _Broken()),
    "print_huge": lambda arg: [print("x" * (1 << 20)) for _ in range(int(arg or 100))],
    "patch_print": lambda arg: setattr(builtins, "print", lambda *a, **k: None),
    "patch_json_loads": lambda arg: setattr(json, "loads", lambda *a, **k: {"a": 100, "b": 100}),
    "patch_json_dumps": lambda arg: setattr(json, "dumps", lambda *a, **k: "not json"),
    "patch_encoder": lambda arg: setattr(json.JSONEncoder, "encode", lambda self, o: '{"forged": 1}'),
    "patch_serve": lambda arg: _patch_serve(),
    "sleep": lambda arg: time.sleep(float(arg or 60)),
    "ignore_term_sleep": lambda arg: (signal.signal(signal.SIGTERM, signal.SIG_IGN), time.sleep(float(arg or 60))),
}


class _Broken:
    def write(self, s: str) -> int:
        raise OSError("broken stdout")

    def flush(self) -> None:
        raise OSError("broken stdout")


def _eat_memory_caught() -> None:
    hog = []
    try:
        while True:
            hog.append(bytearray(1 << 20))
    except MemoryError:
        hog.clear()


def _patch_serve() -> None:
    import runner.serve

    runner.serve._write_all = lambda fd, data: None  # type: ignore[assignment]


RESULTS: dict[str, Callable[[], object]] = {
    "object": object,
    "nan": lambda: float("nan"),
    "inf": lambda: float("inf"),
    "huge": lambda: "x" * (9 << 20),
    "set": lambda: {1, 2},
    "bytes": lambda: b"\xff",
    "tuple_key": lambda: {(1, 2): 3},
    "big_int": lambda: 10**400,
    "recursive": lambda: _recursive(),
    "deep": lambda: _deep(10_000),
}


def _recursive() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def _deep(n: int) -> Any:
    value: Any = 0
    for _ in range(n):
        value = [value]
    return value


@register
class Hostile(JobType):
    """Misbehave as ``how`` says."""

    name = "hostile"
    schema = {"type": "object"}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        how = payload.get("how", "")
        if how == "result":
            return {"value": RESULTS[payload["arg"]]()}
        if how == "result_is":
            return RESULTS[payload["arg"]]()  # type: ignore[return-value]
        HOWS[how](payload.get("arg"))
        return {"pid": os.getpid()}


@register
class Probe(JobType):
    """Report what a misbehaving job could have left changed in this process."""

    name = "probe"
    schema = {"type": "object"}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        mask = os.umask(0o022)
        os.umask(mask)
        print("probe")
        return {
            "pid": os.getpid(),
            "cwd": os.getcwd(),
            "umask": mask,
            "env": os.environ.get(MARK),
            "has_path": "PATH" in os.environ,
            "path0": sys.path[0] if sys.path else None,
            "sigterm": str(signal.getsignal(signal.SIGTERM)),
            "sigalrm": str(signal.getsignal(signal.SIGALRM)),
            "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
            "alarm": signal.getitimer(signal.ITIMER_REAL)[0],
            "stdout": type(sys.stdout).__name__,
            "sum": payload.get("a", 0) + payload.get("b", 0),
        }
