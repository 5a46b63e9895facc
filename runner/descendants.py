"""Finding a process's descendants by pid, and ending this process's: what its jobs started, whether
or not it stayed in the runner's process group.

A process group cannot hold what a job starts: ``setsid()`` or ``setpgid()`` takes a process out of
it (a daemon's double fork does), and ``killpg`` then misses it. Parenthood holds, though: the kernel
lists each task's children in ``/proc/PID/task/TID/children``, and a runner adopts orphans
(``PR_SET_CHILD_SUBREAPER``), so what a job's processes leave behind when they exit comes back to it
as its child. :func:`end_descendants` walks that tree, kills every process in it and reaps the
runner's own children, again and again until the tree is empty, since a process may fork while it is
walked (the kill ends that; what it forked comes back to the runner, and the next walk finds it).

The same walk, written in C, runs in the runner's signal handler when its worker dies
(:mod:`runner._lifeline`); this one is the runner's as it exits, and works without compiled modules.
Linux only: elsewhere (no ``/proc``) the tree is empty and nothing is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

__all__ = ["children", "descendants", "end_descendants"]

MAX_ROUNDS = 1000
"""Walks :func:`end_descendants` makes at most: ends a fork bomb that outruns it rather than looping for ever."""
MAX_WAIT_SEC = 0.5
"""How long :func:`end_descendants` waits, in all, for killed children to be gone (as the C handler)."""


def children(pid: int | None = None) -> set[int]:
    """Pids of the children of ``pid`` (None: this process), from every one of its threads (a child
    belongs to the thread that forked it). Empty when the process is gone or the kernel lists nothing."""
    where = "self" if pid is None else str(pid)
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{where}/task")
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError), open(f"/proc/{where}/task/{task}/children", "rb") as f:
            found.update(int(child) for child in f.read().split())
    return found


def descendants(pid: int | None = None) -> list[int]:
    """Pids of every descendant of ``pid`` (None: this process), parents before their children: one
    walk, which a process forking meanwhile may outrun (see :func:`end_descendants`)."""
    found: list[int] = []
    seen: set[int] = set()
    level = children(pid)
    while level:
        fresh = level - seen
        seen |= fresh
        found.extend(sorted(fresh))
        level = set().union(*(children(child) for child in fresh)) if fresh else set()
    return found


def end_descendants() -> int:
    """SIGKILL every descendant of this process and reap its own children, until none is left (at most
    :data:`MAX_ROUNDS` walks); returns how many processes were killed.

    The children it killed are waited for (a SIGKILL is quick), so that what they leave comes back to
    this process, when it adopts orphans, before the next walk; one forked after the walk is the next
    walk's. A child another thread waits for too (a job's ``Popen.wait``) may be reaped there instead.
    The waits stop after :data:`MAX_WAIT_SEC` in all (a child in uninterruptible sleep, a hung network
    file system's read, dies only when that ends), and so do the walks when one kills nothing (what is
    left is another user's, a set-uid program's, which this process may not signal).
    """
    killed: set[int] = set()
    deadline = time.monotonic() + MAX_WAIT_SEC
    for _ in range(MAX_ROUNDS):
        hit: set[int] = set()
        for pid in descendants():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                hit.add(pid)
        if not hit:
            break
        killed.update(hit)
        for pid in children().intersection(hit):
            _reap(pid, deadline)
        if time.monotonic() >= deadline:
            break
    return len(killed)


def _reap(pid: int, deadline: float) -> None:
    """Reap the child ``pid``, which was sent SIGKILL, waiting until ``deadline`` (monotonic) at most."""
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:  # reaped elsewhere
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.001)
