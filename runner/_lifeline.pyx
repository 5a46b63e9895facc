# cython: language_level=3
"""A signal that ends the runner's whole process group, handled in C.

A job's child processes (a tool it runs, a shell command) and a plug-in's helpers are in the runner's
process group. When the worker is killed outright, the kernel signals the runner
(``PR_SET_PDEATHSIG``); if that signal were SIGKILL, only the runner would die and those processes
would run on, orphaned. This handler sends SIGKILL to the group instead. It is a C function, not a
Python handler, because the runner may be deep in native code that never returns to the interpreter
(a Python handler would wait for it), and ``kill`` is safe to call inside a signal handler.
"""

from posix.signal cimport kill, sigaction, sigaction_t, sigemptyset
from libc.signal cimport SIGKILL
from libc.string cimport memset


cdef void _end_group(int signum) noexcept nogil:
    kill(0, SIGKILL)  # 0: every process in our group, this one included


def arm(int signum) -> None:
    """Make ``signum`` end this process's group with SIGKILL; raise OSError if it cannot be set."""
    cdef sigaction_t action
    memset(&action, 0, sizeof(action))
    action.sa_handler = _end_group
    sigemptyset(&action.sa_mask)
    if sigaction(signum, &action, NULL) != 0:
        raise OSError(f"sigaction({signum}) failed")
