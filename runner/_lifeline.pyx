# cython: language_level=3
"""A signal that ends everything the runner started and its whole process group, handled in C, and a
timer that raises it.

A job's child processes (a tool it runs, a shell command) and a plug-in's helpers are in the runner's
process group, unless they left it (``setsid()``, ``setpgid()``: a daemon's double fork). When the
worker is killed outright, the kernel signals the runner (``PR_SET_PDEATHSIG``); if that signal were
SIGKILL, only the runner would die and those processes would run on, orphaned. This handler kills
them instead: first every descendant of the runner by pid (walking ``/proc/self/task/*/children``
down the tree, SIGKILL, reaping its own children, again until none is left: a process may fork while
it is walked, and the runner adopts orphans, so what a killed process leaves comes back to it), which
reaches those that left the group, then the group with SIGKILL, the runner included. It is C, not a
Python handler, because the runner may be deep in native code that never returns to the interpreter
(a Python handler would wait for it); it makes only system calls that are safe inside a signal handler
(``open``, ``read``, ``getdents64``, ``kill``, ``waitpid``, ``clock_gettime``, ``nanosleep``,
``pause``), on static buffers. It never waits long for a killed child: one in uninterruptible sleep
(a hung network file system) dies only when that ends, and one of another user's (a set-uid program)
cannot be killed at all; after half a second in all, or a walk in which nothing could be killed, it
goes on to kill the group, so the runner never outlives its worker. Two of its signals can run at
once on two threads (it is a real-time signal, queued, not merged): the second waits for the first,
which ends the process.

The same signal, from a timer (:func:`end_group_at`), ends a job its worker did not stop at its deadline:
the worker kills a job then, but a worker that stands still (stopped, frozen, its event loop blocked)
kills nothing, while its control plane counts it lost and starts the job again elsewhere.
"""

from posix.signal cimport SIGEV_SIGNAL, kill, sigaction, sigaction_t, sigemptyset, sigevent
from posix.time cimport CLOCK_REALTIME, TIMER_ABSTIME, itimerspec, timer_create, timer_settime
from posix.types cimport time_t, timer_t
from posix.unistd cimport pause
from libc.signal cimport SIGKILL
from libc.string cimport memset

cdef extern from *:
    """
    #include <errno.h>
    #include <fcntl.h>
    #include <signal.h>
    #include <sys/syscall.h>
    #include <sys/types.h>
    #include <sys/wait.h>
    #include <time.h>
    #include <unistd.h>

    #define CORRAL_MAX_TREE 4096
    #define CORRAL_MAX_ROUNDS 1000
    #define CORRAL_WAIT_NS 500000000L  /* the most it waits, in all, for killed children to be gone */

    /* Static rather than on the stack: the handler may run on a thread's small stack. One walk at a
       time uses them (corral_walking): the signal is real-time, so two can be pending and run on two
       threads at once. */
    static pid_t corral_tree[CORRAL_MAX_TREE];
    static int corral_walking = 0;
    static char corral_dents[4096];
    static char corral_text[16384];

    struct corral_dirent64 {
        unsigned long long d_ino;
        long long d_off;
        unsigned short d_reclen;
        unsigned char d_type;
        char d_name[];
    };

    /* Writes the decimal digits of n >= 0 at `at`; returns the end (snprintf is not signal-safe). */
    static char *corral_put_number(char *at, long n) {
        char digits[24];
        int len = 0;
        do { digits[len++] = (char)('0' + n % 10); n /= 10; } while (n > 0);
        while (len > 0) *at++ = digits[--len];
        return at;
    }

    static char *corral_put_text(char *at, const char *text) {
        while (*text) *at++ = *text++;
        return at;
    }

    /* Appends the pids one task's children file lists, from index `count`; returns the new count. Only
       numbers the kernel ended with its space are taken: a number cut by a full buffer is no pid. */
    static int corral_add_task_children(const char *task_dir, const char *tid, int count) {
        char path[128];
        char *end = corral_put_text(corral_put_text(corral_put_text(path, task_dir), "/"), tid);
        *corral_put_text(end, "/children") = 0;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return count;
        long size = 0;
        for (;;) {
            long got = read(fd, corral_text + size, sizeof(corral_text) - size);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break;
            size += got;
            if (size == (long)sizeof(corral_text)) break;
        }
        close(fd);
        long pid = -1;
        for (long i = 0; i < size && count < CORRAL_MAX_TREE; i++) {
            char c = corral_text[i];
            if (c >= '0' && c <= '9') {
                pid = (pid < 0 ? 0 : pid * 10) + (c - '0');
            } else {
                if (pid > 0) corral_tree[count++] = (pid_t)pid;
                pid = -1;
            }
        }
        return count;
    }

    /* Appends the children of every task of `pid` (0: this process); returns the new count. */
    static int corral_add_children(pid_t pid, int count) {
        char task_dir[64];
        char *end = corral_put_text(task_dir, "/proc/");
        end = pid ? corral_put_number(end, pid) : corral_put_text(end, "self");
        *corral_put_text(end, "/task") = 0;
        int dir = open(task_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0) return count;
        for (;;) {
            long got = syscall(SYS_getdents64, dir, corral_dents, sizeof(corral_dents));
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break;
            for (long at = 0; at < got;) {
                struct corral_dirent64 *entry = (struct corral_dirent64 *)(corral_dents + at);
                at += entry->d_reclen;
                if (entry->d_name[0] >= '0' && entry->d_name[0] <= '9')
                    count = corral_add_task_children(task_dir, entry->d_name, count);
            }
        }
        close(dir);
        return count;
    }

    static long corral_now_ns(void) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        return now.tv_sec * 1000000000L + now.tv_nsec;
    }

    /* Reaps the child `pid`, which was sent SIGKILL, waiting until `deadline` (CLOCK_MONOTONIC ns) at
       most: one in uninterruptible sleep (a hung NFS read) dies only when that ends, maybe never. */
    static void corral_reap(pid_t pid, long deadline) {
        struct timespec pause_for = {0, 1000000L};
        for (;;) {
            pid_t got = waitpid(pid, NULL, WNOHANG | __WALL);
            if (got != 0 && !(got < 0 && errno == EINTR)) return;  /* reaped, or not ours to wait for */
            if (corral_now_ns() >= deadline) return;
            nanosleep(&pause_for, NULL);
        }
    }

    /* SIGKILL every descendant of this process, reaping its own children, until none is left, none can
       be killed (another user's) or the wait is spent. Returns 0 if another thread is at it already. */
    static int corral_end_descendants(void) {
        if (__atomic_exchange_n(&corral_walking, 1, __ATOMIC_SEQ_CST)) return 0;
        long deadline = corral_now_ns() + CORRAL_WAIT_NS;
        for (int round = 0; round < CORRAL_MAX_ROUNDS; round++) {
            int count = corral_add_children(0, 0);
            int own = count;
            for (int i = 0; i < count && count < CORRAL_MAX_TREE; i++)
                count = corral_add_children(corral_tree[i], count);
            int killed = 0;
            for (int i = 0; i < count; i++) {
                if (kill(corral_tree[i], SIGKILL) == 0) killed++;
                else if (i < own) corral_tree[i] = 0;  /* not killed: not waited for either */
            }
            if (killed == 0) break;
            /* Reaped, what a child leaves has come back to us (we adopt orphans): the next walk has it. */
            for (int i = 0; i < own; i++)
                if (corral_tree[i] > 0) corral_reap(corral_tree[i], deadline);
            if (corral_now_ns() >= deadline) break;
        }
        __atomic_store_n(&corral_walking, 0, __ATOMIC_SEQ_CST);
        return 1;
    }
    """
    int corral_end_descendants() noexcept nogil

cdef timer_t _timer
cdef bint _made = False


cdef void _end_group(int signum) noexcept nogil:
    if not corral_end_descendants():  # by pid: those that left the group too
        while True:  # another thread's handler is walking, and ends the group after: wait for it
            pause()
    kill(0, SIGKILL)  # 0: every process in our group, this one included


def end_descendants() -> None:
    """Kill every descendant of this process by pid, as the handler does, and reap its own children
    (for tests; the runner's own exit uses :func:`runner.descendants.end_descendants`)."""
    with nogil:
        corral_end_descendants()


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
