"""Open-file descriptors of Corral's long-running processes (the control plane, the worker agent).

Most Linux set-ups give a process a soft ``RLIMIT_NOFILE`` of 1,024 and a far higher hard one (systemd:
1,024 and 524,288; a login shell often the same), and leave it to a program that needs more to raise
its own soft limit: the soft one stays low for the sake of old programs whose ``select()`` cannot
watch a descriptor numbered 1,024 or more. Corral's processes never use ``select()``: the control plane
holds a socket per client, worker and REST connection (up to CORRAL_HTTP_MAX_CONNECTIONS = 1,000 of
the last alone), and a worker three descriptors per runner process (up to 1,024 of them). So each
raises its soft limit to its hard one as it starts (:func:`raise_soft_limit`); a runner process puts
the soft limit it inherited back before it runs a job (``runner.serve --open-files``), so the user's
code sees the limit the worker was started with.

gRPC's C core ends the whole process (``abort()``) when it cannot get a descriptor it needs to open a
channel, so a worker also looks before it connects (:func:`spare`): with fewer than
:data:`CONNECT_RESERVE` left it waits and looks again, and it refuses at start a number of runner
processes its hard limit cannot hold (:func:`needed_by_worker`).
"""

from __future__ import annotations

import errno
import os
import resource

__all__ = [
    "CONNECT_RESERVE",
    "CONTROL_RESERVE",
    "PER_RUNNER",
    "WORKER_BASE",
    "fitted_http_connections",
    "hard_limit",
    "in_use",
    "inherited",
    "most_slots",
    "needed_by_worker",
    "raise_soft_limit",
    "soft_limit",
    "spare",
]

PER_RUNNER = 3
"""Descriptors a worker holds for each runner process: the ends of its two pipes, and its pidfd."""
WORKER_BASE = 40
"""Descriptors a worker holds apart from its runners: the interpreter's, the event loop's, its log
files, and gRPC's (an epoll, an eventfd and a socket or two per channel); about 20 measured."""
CONNECT_RESERVE = 32
"""Descriptors a worker keeps free to open a channel to the control plane: gRPC aborts the process
when it cannot get one there. Also what a runner replacement takes for a moment (two pipes, a pidfd,
and the pipe through which a failed exec reports)."""

CONTROL_RESERVE = 320
"""Descriptors a control plane keeps apart from its HTTP connections: the interpreter's, the store's
files and the event loop's, gRPC's listeners, and a socket for each worker and gRPC client (about 256
of them), which REST connections must not be able to take."""
HTTP_PROBE_RESERVE = 16
"""The connections past the HTTP cap that serve probes and /metrics only (control.gateway)."""

_unlimited = resource.RLIM_INFINITY
_inherited: int | None = None
"""The soft limit this process started with, once :func:`raise_soft_limit` raised it."""


def soft_limit() -> int:
    """This process's soft ``RLIMIT_NOFILE``: how many descriptors it may have open."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def hard_limit() -> int:
    """This process's hard ``RLIMIT_NOFILE``: how far it may raise its soft one."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def raise_soft_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one (to the kernel's ``fs.nr_open`` when the hard
    one is unlimited); returns the soft limit it had before, which is kept when it cannot be raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == _unlimited:
        try:
            with open("/proc/sys/fs/nr_open", encoding="ascii") as f:
                target = int(f.read())
        except (OSError, ValueError):
            return soft
    global _inherited
    if soft != _unlimited and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            return soft  # a sandbox that forbids it: the process runs within the limit it was given
        if _inherited is None:
            _inherited = soft
    return soft


def inherited() -> int | None:
    """The soft limit this process started with, if :func:`raise_soft_limit` raised it since: what the
    programs it starts for users should get back."""
    return _inherited


def in_use() -> int:
    """Descriptors this process has open now."""
    return len(os.listdir("/proc/self/fd")) - 1  # less the one that listdir itself opened


def spare() -> int:
    """Descriptors this process may still open before it reaches its soft limit (0 when it has)."""
    soft = soft_limit()
    if soft == _unlimited:
        return CONNECT_RESERVE * 1024
    try:
        return max(0, soft - in_use())
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):  # listing /proc/self/fd takes a descriptor too
            return 0
        return CONNECT_RESERVE * 1024  # no /proc to count with: let the connection tell


def fitted_http_connections(configured: int) -> int:
    """The HTTP connection cap the control plane can hold within its soft limit (raised as it started):
    ``configured`` (0: no cap), lowered so that the connections it admits, and the probes' reserve past
    them, leave :data:`CONTROL_RESERVE` descriptors to workers, gRPC clients and the store. At least 1."""
    soft = soft_limit()
    if soft == _unlimited:
        return configured
    room = max(1, soft - CONTROL_RESERVE - HTTP_PROBE_RESERVE)
    return room if configured == 0 or configured > room else configured


def needed_by_worker(slots: int) -> int:
    """Descriptors a worker with ``slots`` runner processes needs, with its reserve to connect."""
    return WORKER_BASE + PER_RUNNER * slots + CONNECT_RESERVE


def most_slots() -> int | None:
    """The most runner processes a worker's hard limit holds (:func:`needed_by_worker`); None: no limit."""
    hard = hard_limit()
    if hard == _unlimited:
        return None
    return max(0, (hard - needed_by_worker(0)) // PER_RUNNER)
