"""What a runner process leaves behind when it dies without ending it: the processes its jobs started
that left its process group.

A runner ends everything it started as it exits (:func:`runner.descendants.end_descendants`) and when
its worker dies (:mod:`runner._lifeline`). One that is killed (a job's timeout or cancel, its pipe
garbled, a retired one that hung) or that crashes has no say, and the worker's ``killpg`` reaches its
process group only, not a process that left it (``setsid()``, ``setpgid()``, a daemon's double fork).
The kernel gives such a process, when its runner dies, to the nearest ancestor that adopts orphans;
with none, to init, under which it would run for ever.

So a process that runs pools adopts orphans (``PR_SET_CHILD_SUBREAPER``, from its first pool's start,
:func:`adopt`, to its last pool's stop, :func:`release`), and a pool ends its strays: after each of
its runner processes exits, :meth:`StrayReaper.sweep` kills every stray child of this process with
SIGKILL and, once its pidfd says it has exited, reaps it by its pid (``waitpid(pid, WNOHANG)``; never
``waitpid(-1)``, which would take a runner's exit status from its :class:`~worker.process.RunnerProcess`,
or a ``subprocess.Popen``'s from it), then sweeps again: what the stray itself started comes to this
process in turn. A stray's pid stays its own until it is reaped, so none is killed by a stale pid.

A stray is a child of this process that

* is none of the runner processes of the pools here (:func:`starting_runner`, :func:`runner_reaped`);
* was not its child already when it began adopting orphans (what a program that hosts a pool, a test
  for one, started before it is not a pool's);
* is not in its session: a runner leads a session of its own (``start_new_session``), and what its jobs
  start stays in that one or leaves it for one of its own, never this one, while the programs a host
  starts are mostly in the host's.

In a worker agent, whose children are its runner processes, every other child is a stray. A program
that hosts a pool and starts a child in a session of its own while the pool runs
(``start_new_session=True``) may have it taken for one when a runner dies: it should start it first.
Strays get SIGKILL with no SIGTERM first: they left the group that the SIGTERM of a job's timeout goes
to, and their runner is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator

from corral.logs import STRAY_NOT_KILLED
from runner.descendants import children

__all__ = ["StrayReaper", "adopt", "adopting", "release", "runner_reaped", "starting_runner", "strays"]

logger = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37

_lock = threading.Lock()
"""Guards the state below: pools may run on event loops of several threads."""
_runners: set[int] = set()
"""Pids of the runner processes of every pool in this process, from their start until they are reaped."""
_kept: set[int] = set()
"""Children this process had when it began adopting orphans: not the pools' to end."""
_ending: set[int] = set()
"""Strays a reaper has killed and waits for: no other reaper takes them up."""
_users = 0
"""Pools that need this process to adopt orphans (started, not yet stopped)."""
_adopted_before = False
"""Whether this process adopted orphans before its first pool asked for it (it does after the last one)."""


def _prctl(option: int, value: int) -> int:
    """``prctl(option, value)``'s result; -1 where it cannot be called (not Linux)."""
    try:
        result: int = ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        return -1
    return result


def adopting() -> bool:
    """Whether this process adopts orphans now (``PR_GET_CHILD_SUBREAPER``)."""
    flag = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value)
    except (OSError, AttributeError):
        return False


def adopt() -> None:
    """Have this process adopt the orphans of its descendants, for a pool that starts (each call wants
    a :func:`release`); the first call takes note of the children it has, which are never strays."""
    global _users, _adopted_before
    with _lock:
        _users += 1
        if _users > 1:
            return
        _adopted_before = adopting()
        _kept.clear()
        _kept.update(children())
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def release() -> None:
    """A pool that called :func:`adopt` stopped: the last one puts this process's setting back."""
    global _users
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and not _adopted_before:
            _prctl(_PR_SET_CHILD_SUBREAPER, 0)


@contextlib.contextmanager
def starting_runner() -> Iterator[Callable[[int], None]]:
    """Start a runner process inside this (``with starting_runner() as started: ...; started(pid)``):
    no sweep, in any thread, sees it between its fork and its being known as a runner."""
    with _lock:
        yield _runners.add


def runner_reaped(pid: int) -> None:
    """The runner process ``pid`` has been reaped: its pid is no runner's any more."""
    with _lock:
        _runners.discard(pid)


def strays() -> list[int]:
    """This process's stray children now (see the module docstring), those being ended left out."""
    with _lock:
        return _find()


def _find() -> list[int]:
    """:func:`strays`, with the lock held."""
    own_session = os.getsid(0)
    now = children()
    _kept.intersection_update(now)  # one that was reaped: its pid may come back as a stray's
    found = []
    for pid in now - _runners - _kept - _ending:
        try:
            if os.getsid(pid) == own_session:
                continue
        except ProcessLookupError:  # reaped meanwhile, by whoever started it
            continue
        found.append(pid)
    return found


class StrayReaper:
    """Ends and reaps the strays of one event loop's pools (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """A reaper whose waits run on ``loop`` (the pool's)."""
        self._loop = loop
        self._pidfds: dict[int, int] = {}
        """Each stray killed and not yet reaped, and its pidfd (-1: none could be opened)."""
        self._settled = asyncio.Event()
        self._settled.set()

    def sweep(self) -> int:
        """Kill every stray child of this process now, and reap each once it is gone; returns how many."""
        with _lock:  # found and claimed at once: a reaper on another thread must not take them too
            found = _find()
            _ending.update(found)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)  # our child, not yet reaped: the pid is still its own
            except ProcessLookupError:
                pass
            except PermissionError:  # another user's (a set-uid program a job ran): reaped when it exits
                logger.warning(STRAY_NOT_KILLED, extra={"pid": pid, "reason": "not permitted (another user's)"})
            self._watch(pid)
        return len(found)

    async def settle(self, within: float) -> bool:
        """Wait until every stray killed so far is reaped; False if ``within`` seconds passed first."""
        try:
            await asyncio.wait_for(self._settled.wait(), within)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Stop waiting for the strays not yet reaped. Killed already, they stay this process's children
        until they are reaped: by a next pool's reaper, or as zombies until this process exits."""
        for pid, fd in list(self._pidfds.items()):
            if fd >= 0:
                self._loop.remove_reader(fd)
                os.close(fd)
            with _lock:
                _ending.discard(pid)
        self._pidfds.clear()
        self._settled.set()

    def _watch(self, pid: int) -> None:
        """Reap ``pid`` when it has exited: at once if it has, else when its pidfd becomes readable."""
        self._settled.clear()
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # out of descriptors, say: look again shortly instead
            self._pidfds[pid] = -1
            self._loop.call_later(0.01, self._on_exit, pid)
            return
        self._pidfds[pid] = fd
        self._loop.add_reader(fd, self._on_exit, pid)

    def _on_exit(self, pid: int) -> None:
        fd = self._pidfds.pop(pid, None)
        if fd is None:  # closed meanwhile
            return
        if fd >= 0:
            self._loop.remove_reader(fd)
            os.close(fd)
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere
            reaped = pid
        if not reaped:  # no pidfd, and not gone yet
            self._pidfds[pid] = -1
            self._loop.call_later(0.01, self._on_exit, pid)
            return
        with _lock:
            _ending.discard(pid)
        self.sweep()  # what it started, now that it is gone, is this process's child
        if not self._pidfds:
            self._settled.set()
