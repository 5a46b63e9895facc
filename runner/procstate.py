"""What a job may change in its runner process for the jobs after it, and putting it back.

A runner process runs job after job, so process-wide state one job changes would hold under the next
ones: its working directory, umask, environment, ``sys.path``, signal handlers and interval timers (an
``alarm()`` left pending kills the runner under a later job), resource limits (a low
``RLIMIT_NOFILE``, an ``RLIMIT_CPU`` whose SIGXCPU ends a later job), the ``sys.std*`` objects, and
the descriptors 1 and 2 (closed, or ``dup2`` ed over to a file of the job's).

:class:`ProcessState` takes a snapshot of that state once, before the first job
(:meth:`ProcessState.take`), and :meth:`ProcessState.restore` puts back, after each job, what the job
changed. It says whether the process may run another job: not when something could not be put back
(a hard resource limit lowered, which only a privileged process may raise again; a handler replaced
over one installed from C, such as :mod:`runner._lifeline`'s; the working directory removed).

The runner's own pipes to the worker are kept out of a job's way differently, at no cost per job:
:func:`move_high` moves them, as the process starts, to descriptors far above those a job opens or
``dup2`` s over (so ``os.close(4)`` or ``os.dup2(f, 4)`` in a job touches no pipe of the runner's); a
job that closes them anyway (``os.closerange(3, 65536)``) leaves an answer that cannot be written, and
the runner exits with :data:`LOST_PIPES_EXIT`, which the worker reports.

The check costs a dozen system calls per job and comparisons of small Python objects; what differs is
put back only then.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module under signal, without its enum wrapping
import contextlib
import fcntl
import os
import resource
import signal
import sys
from typing import Any

__all__ = ["LOST_PIPES_EXIT", "ProcessState", "move_high"]

LOST_PIPES_EXIT = 75
"""The exit status of a runner whose job closed or replaced its pipes to the worker beyond repair."""

_RLIMITS = tuple(
    getattr(resource, f"RLIMIT_{name}")
    for name in ("AS", "CPU", "FSIZE", "NOFILE", "NPROC")
    if hasattr(resource, f"RLIMIT_{name}")
)
"""The limits a job could set to break the jobs after it: too few descriptors or processes, a CPU or
file-size limit whose signal would end a later job, the memory limit (:mod:`runner.limits`) lowered, or
raised by a privileged job (it is the hard limit too, which only such a job can raise; one that lowers
it leaves a runner that cannot put it back, and is replaced). (Each check is a system call; the others
matter less.)"""
_TIMERS = (signal.ITIMER_REAL,)
"""The timers checked: the one ``alarm()`` and ``setitimer(ITIMER_REAL)`` set (the others are a
profiler's, and cost a system call each)."""
_SIGNAL_NAMES = (
    *("SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGCHLD"),
    *("SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO"),
)
_SIGNALS = (
    *(int(getattr(signal, name)) for name in _SIGNAL_NAMES if hasattr(signal, name)),
    int(signal.SIGRTMIN) + 3,  # runner.serve.PARENT_GONE, runner._lifeline's
)
"""The signals whose handlers are checked: those a job may catch or ignore (the faults' handlers are
C's, faulthandler's), and the one that ends the runner with its worker."""
# The handlers are read and put back through _signal, as plain ints for SIG_DFL and SIG_IGN: the
# signal module's wrappers turn those into enum members, at a cost that made up most of the check.
_getsignal = _signal.getsignal
_setsignal = _signal.signal
_HIGH_FLOOR = 1000
"""The runner's pipes and its copies of 1 and 2 go at or above this (or just under the process's
descriptor limit, when that is lower): clear of the low numbers jobs open and ``dup2`` over."""


def _identity(fd: int) -> tuple[int, int] | None:
    """What the descriptor ``fd`` refers to (device, inode), None if it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _backup(fd: int) -> int:
    """A close-on-exec copy of ``fd`` at a high number (-1 if it cannot be made)."""
    floor = _HIGH_FLOOR
    with contextlib.suppress(ValueError, OSError):
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:
            floor = min(floor, max(3, soft - 16))
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)
    except OSError:
        return -1


def move_high(fd: int) -> int:
    """``fd`` moved to a high, close-on-exec descriptor (see the module docstring); the new number
    (``fd`` itself, left as it is, if no higher one can be had)."""
    high = _backup(fd)
    if high < 0:
        return fd
    os.close(fd)
    return high


class ProcessState:
    """The state of this process that jobs must leave as they found it (see the module docstring)."""

    def __init__(self) -> None:
        """Nothing is taken yet."""
        self._fds: dict[int, tuple[tuple[int, int], int]] = {}
        """Each watched descriptor: what it refers to, and a backup copy of it (-1: none)."""
        self._cwd = ""
        self._umask = 0
        self._environ: dict[Any, Any] = {}
        self._path: list[str] = []
        self._handlers: dict[int, Any] = {}
        self._limits: dict[int, tuple[int, int]] = {}
        self._timers_idle: tuple[int, ...] = ()
        self._streams: tuple[Any, Any, Any] = (None, None, None)

    def take(self) -> None:
        """Remember the current state (once, before the first job)."""
        for fd in (1, 2):  # stdin is /dev/null: a job's changing it harms nobody
            ident = _identity(fd)
            if ident is not None:
                self._fds[fd] = (ident, _backup(fd))
        self._cwd = os.getcwd()
        self._umask = os.umask(0o022)
        os.umask(self._umask)
        self._environ = dict(_environ_data())
        self._path = list(sys.path)
        self._handlers = {s: _getsignal(s) for s in _SIGNALS}
        for limit in _RLIMITS:
            with contextlib.suppress(ValueError, OSError):
                self._limits[limit] = resource.getrlimit(limit)
        self._timers_idle = tuple(t for t in _TIMERS if signal.getitimer(t) == (0.0, 0.0))
        self._streams = (sys.stdin, sys.stdout, sys.stderr)

    def restore(self) -> bool:
        """Put back what changed since :meth:`take`; returns whether the process may run another job."""
        reusable = True
        for timer in self._timers_idle:  # first: a pending alarm must not go off meanwhile
            if signal.getitimer(timer) != (0.0, 0.0):
                signal.setitimer(timer, 0.0)
        os.umask(self._umask)  # one call, whether or not the job changed it
        for sig, handler in self._handlers.items():
            if _getsignal(sig) != handler:
                if handler is None:  # it had one installed from C: Python cannot put that back
                    reusable = False
                    continue
                try:
                    _setsignal(sig, handler)
                except (OSError, ValueError, TypeError):
                    reusable = False
        for limit, value in self._limits.items():
            if resource.getrlimit(limit) != value:
                try:
                    resource.setrlimit(limit, value)
                except (ValueError, OSError):  # a lowered hard limit, and no privilege to raise it
                    reusable = False
        try:
            cwd_ok = os.getcwd() == self._cwd
        except OSError:  # the job removed the directory it was in
            cwd_ok = False
        if not cwd_ok:
            try:
                os.chdir(self._cwd)
            except OSError:
                reusable = False
        data = _environ_data()
        if data != self._environ:
            _put_back_environ(self._environ)
        if sys.path != self._path:
            sys.path[:] = self._path
        if (sys.stdin, sys.stdout, sys.stderr) != self._streams:
            stdin, stdout, stderr = (
                saved if _usable(saved) else now
                for saved, now in zip(self._streams, (sys.stdin, sys.stdout, sys.stderr), strict=True)
            )
            sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
        for fd, (ident, backup) in self._fds.items():
            if _identity(fd) == ident:
                continue
            try:
                if backup < 0 or _identity(backup) != ident:
                    raise OSError(f"no copy of descriptor {fd} left")
                os.dup2(backup, fd)
            except OSError:
                reusable = False
        return reusable


def _usable(stream: Any) -> bool:
    """Whether a saved ``sys.std*`` stream can still be used: not one a job detached (``sys.stdout =
    io.TextIOWrapper(sys.stdout.detach())``, whose rewrapped stream is then the one to keep)."""
    try:
        return stream is not None and not stream.closed and getattr(stream, "buffer", True) is not None
    except ValueError:  # "underlying buffer has been detached"
        return False


def _environ_data() -> dict[Any, Any]:
    """The environment as ``os.environ`` holds it (its private mapping: no copy, no decoding)."""
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else dict(os.environ)


def _put_back_environ(saved: dict[Any, Any]) -> None:
    """Make ``os.environ`` (and the C environment of the programs jobs start) ``saved`` again."""
    decode = os.fsdecode
    current = dict(_environ_data())
    for key in current.keys() - saved.keys():
        with contextlib.suppress(KeyError):
            del os.environ[decode(key)]
    for key, value in saved.items():
        if current.get(key) != value:
            os.environ[decode(key)] = decode(value)
