# cython: language_level=3
"""A signal that ends the runner's whole process group, handled in C, and a timer that raises it.

A job's child processes (a tool it runs, a shell command) and a plug-in's helpers are in the runner's
process group. When the worker is killed outright, the kernel signals the runner
(``PR_SET_PDEATHSIG``); if that signal were SIGKILL, only the runner would die and those processes
would run on, orphaned. This handler sends SIGKILL to the group instead. It is a C function, not a
Python handler, because the runner may be deep in native code that never returns to the interpreter
(a Python handler would wait for it), and ``kill`` is safe to call inside a signal handler.

The same signal, from a timer (:func:`end_group_at`), ends a job its worker did not stop at its deadline:
the worker kills a job then, but a worker that stands still (stopped, frozen, its event loop blocked)
kills nothing, while its control plane counts it lost and starts the job again elsewhere.
"""

from posix.signal cimport SIGEV_SIGNAL, kill, sigaction, sigaction_t, sigemptyset, sigevent
from posix.time cimport CLOCK_REALTIME, TIMER_ABSTIME, itimerspec, timer_create, timer_settime
from posix.types cimport time_t, timer_t
from libc.signal cimport SIGKILL
from libc.string cimport memset

cdef timer_t _timer
cdef bint _made = False


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


def make_timer(int signum) -> None:
    """Make the timer of :func:`end_group_at`, which raises ``signum`` (made :func:`arm`); raise OSError if
    it cannot be made."""
    global _timer, _made
    cdef sigevent event
    memset(&event, 0, sizeof(event))
    event.sigev_notify = SIGEV_SIGNAL
    event.sigev_signo = signum
    if timer_create(CLOCK_REALTIME, &event, &_timer) != 0:
        raise OSError("timer_create failed")
    _made = True


def end_group_at(double when) -> None:
    """End this process's group at the system time ``when`` (seconds since the epoch), or never (0): one
    time at a time, each call replacing the last. Two system calls' worth; nothing without :func:`make_timer`."""
    cdef itimerspec spec
    if not _made:
        return
    memset(&spec, 0, sizeof(spec))
    if when > 0:
        spec.it_value.tv_sec = <time_t>when
        spec.it_value.tv_nsec = <long>((when - <double>spec.it_value.tv_sec) * 1e9)
    timer_settime(_timer, TIMER_ABSTIME, &spec, NULL)
