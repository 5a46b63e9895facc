"""The loop of a pre-started runner process: read a request frame, run the job, write a response.

A worker's pool starts ``python -m runner.serve --in FD --out FD --parent PID [--import MODULE]...``
and talks to it over two pipes in the :mod:`runner.wire` format. The process

* adopts orphans (``PR_SET_CHILD_SUBREAPER``, :func:`adopt_orphans`): what a job's processes leave running
  in the background becomes its child rather than init's, so that the check below finds it;
* dies with its parent: it asks the kernel for a signal when the parent goes (``PR_SET_PDEATHSIG``),
  on which :mod:`runner._lifeline` kills every process it started, by pid (its descendants, whether
  or not they left its process group: ``setsid``, a daemon's double fork), then its whole process
  group, then checks the parent did not die before that request, and it exits at end of file on its
  request pipe, so no runner, nor a process a job started, outlives its worker even after ``kill -9``;
* imports the plug-in modules once, starts the compiled kernels' threads (``--threads``: as many as a job
  may use, so that none is started under the memory limit), applies the per-job
  memory limit (``--memory-limit-mb``, see :mod:`runner.limits`), then writes READY with the job
  types it runs (:func:`catalog`); a plug-in that does not import is answered ``FAILED``
  ``PLUGIN_IMPORT`` with the reason instead, and the process exits 2;
* reports a job that ran out of memory as ``MEMORY_LIMIT`` and then exits, so that the worker
  replaces it with a fresh process; an answer after which the process exits is flagged ``LAST``
  (:mod:`runner.wire`), so the worker sends it no other job;
* fails a result over ``corral.limits.MAX_RESULT_BYTES`` with ``RESULT_TOO_LARGE`` and cuts error
  messages to ``MAX_ERROR_MESSAGE_BYTES``, so that nothing a job returns can outgrow the worker's stream;
* exits after answering a job that left a process of its own running, or a thread running (it would
  run on under later jobs, and print into their output): the process exits with it, or, for a
  non-daemon thread, the worker kills it (``worker.pool.RETIRE_GRACE_SEC``);
* ends every process it started as it exits, whatever the reason (:func:`runner.descendants.end_descendants`:
  by pid, so that one that left its process group goes too; the worker's ``killpg`` reaches only the
  group): a job's processes end with the job, and a plug-in's helpers with the runner;
* exits after ``--max-jobs`` jobs, or after a job that left it over ``--max-rss-mb`` MiB resident (a
  plug-in that leaks), when the worker asks for that (CORRAL_RUNNER_MAX_JOBS, CORRAL_RUNNER_MAX_RSS_MB);
* ignores SIGINT (a Ctrl-C meant for the worker must not kill running jobs; the worker decides) and
  keeps the default SIGTERM action, which is how the worker stops a job at its deadline;
* catches what each job prints (``--output-bytes``, :mod:`runner.output`): sends it live while the job
  runs (``PRINTED`` frames, at most every 0.2 s, all before the job's answer) and its end with the answer;
* sets ``CUDA_VISIBLE_DEVICES`` to the GPUs the worker gave a job (empty for none, on a worker that has
  GPUs) while the job runs, and puts its own value back after; since CUDA reads the variable once per
  process, it exits after answering a job that held GPUs (see :mod:`runner.wire`).

Nothing here logs per job: the hot path is read, ``json.loads``, run, ``json.dumps``, write.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

from runner import JobContext, all_types, check_result_json, execute, load_plugins
from runner.descendants import children, end_descendants
from runner.errors import JobFailed, as_text
from runner.limits import apply_memory_limit, warm_up_threads
from runner.output import LiveFeed, PrintStream, PrintTail, keep_std_streams_open
from runner.procstate import LOST_PIPES_EXIT, ProcessState, move_high
from runner.registry import builtin_names
from runner.wire import (
    DEVICES_ENV,
    FAILED,
    INHERIT_DEVICES,
    PLUGIN_IMPORT,
    READY,
    REQUEST,
    encode_failure,
    encode_printed,
    encode_response,
    encode_result,
    last,
    with_output,
)

__all__ = ["adopt_orphans", "catalog", "die_with_parent", "live_feed", "main", "serve"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_adopting = False
"""Whether this process already adopts orphans (see :func:`adopt_orphans`)."""
# The signal the kernel sends when the worker goes: a real-time one that jobs have no use for, handled
# by runner._lifeline (it ends every process this one started, then the whole process group).
PARENT_GONE = signal.SIGRTMIN + 3


def die_with_parent(parent_pid: int) -> Callable[[float], None] | None:
    """Have the kernel end this process, every process it started and its process group when its
    parent exits; exit now if it already has. Returns what ends them at a given system time (0: never;
    see :func:`serve`), or None without the compiled :mod:`runner._lifeline`.

    Its descendants (what jobs started, in the group or out of it, and plug-ins' helpers) are found by
    pid and killed first, then the group; without the compiled :mod:`runner._lifeline`, only this
    process is killed.
    """
    end_group_at: Callable[[float], None] | None = None
    try:
        from runner import _lifeline

        _lifeline.arm(PARENT_GONE)
        death_signal = PARENT_GONE
        with contextlib.suppress(OSError):
            _lifeline.make_timer(PARENT_GONE)
            end_group_at = _lifeline.end_group_at
    except (ImportError, OSError):
        death_signal = signal.SIGKILL
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: end of file on the pipe still stops us
        pass
    if os.getppid() != parent_pid:
        os._exit(1)
    return end_group_at


def adopt_orphans() -> None:
    """Make this process the parent of whatever its jobs' processes leave running in the background
    (idempotent; the runner does it as it starts).

    Orphans otherwise go to init, out of sight of the runner's check for processes a job left behind
    (:func:`_children_left`), and out of reach of the walk that ends them (:mod:`runner.descendants`);
    as its children they are found there, whether or not they left its process group. Children do not
    inherit the setting: a program a job runs adopts nothing.
    """
    global _adopting
    if _adopting:
        return
    with contextlib.suppress(OSError, AttributeError):  # not Linux: leftovers run on unseen
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            _adopting = True


def serve(
    requests: BinaryIO,
    out_fd: int,
    memory_limit_mb: int = 0,
    max_jobs: int = 0,
    max_rss_mb: int = 0,
    output_bytes: int = 0,
    feed: LiveFeed | None = None,
    end_group_at: Callable[[float], None] | None = None,
    backstop_sec: float = 0.0,
) -> None:
    """Answer requests until end of file on ``requests``, or until an answer is the last (flagged
    ``LAST``): a job ran out of memory or left a process or a thread running, or the process reached
    ``max_jobs`` jobs or ``max_rss_mb`` MiB resident (0: no such limit). ``output_bytes``: how much of what each
    job prints goes back with its answer, and is sent live meanwhile (:mod:`runner.output`; 0: none is
    caught); ``feed``: the :func:`live_feed` for that, if made beforehand. ``end_group_at`` with
    ``backstop_sec`` > 0: a job still running ``backstop_sec`` past its deadline ends with every process
    this one started and its process group, should its worker, which stops it at the deadline, stand
    still (:mod:`runner._lifeline`)."""
    header_size = REQUEST.size
    unpack = REQUEST.unpack
    read = requests.read
    dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
    loads = json.loads  # bound now: a job that replaces json.loads must not change the next jobs' payloads
    own_pid = os.getpid()
    backstop = end_group_at if backstop_sec > 0 else None
    _write_all(out_fd, encode_response(READY, body=catalog()))
    state = ProcessState()
    state.take()  # what each job must leave as it found it (runner.procstate)
    # Only a plug-in's job (user code) is checked after it: the built-in types change no process state,
    # and the check costs a dozen system calls, which was a tenth of a noop job's throughput.
    ours = builtin_names()
    before = children()  # helpers a plug-in started as it was imported: theirs to keep, not a job's
    done = 0
    if output_bytes and feed is None:
        feed = live_feed(out_fd, output_bytes)
    if feed is not None:  # made once: a job then costs two swaps, a clear and its ending
        tail = feed.tail
        streams = PrintStream(tail, 1, feed), PrintStream(tail, 2, feed)
    while True:
        header = read(header_size)
        if len(header) < header_size:
            return
        payload_len, id_len, type_len, attempt, threads, deadline, devices_len = unpack(header)
        inherit = devices_len == INHERIT_DEVICES  # a worker without GPUs: CUDA_VISIBLE_DEVICES stays as it is
        if inherit:
            devices_len = 0
        payload_at = id_len + type_len + devices_len
        body = read(payload_at + payload_len)
        if len(body) < payload_at + payload_len:
            return
        job_id = body[:id_len].decode()
        job_type = body[id_len : id_len + type_len].decode()
        own_devices = None if inherit else _show_devices(body[id_len + type_len : payload_at].decode())
        # The process must not run another job. CUDA reads CUDA_VISIBLE_DEVICES once per process, so
        # a job that held GPUs is its process's last: the next one would see its devices.
        spent = devices_len > 0
        threads_at_start = set(threading.enumerate())  # to tell the threads a job leaves running
        if feed is not None:
            feed.clear()
            real = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = streams
        escaped: BaseException | None = None
        try:
            payload = loads(body[payload_at:]) if payload_len else {}
            if not isinstance(payload, dict):
                raise JobFailed("INVALID_PAYLOAD", "payload: is not a JSON object")
            ctx = JobContext(job_id, attempt, threads, deadline or None)
            if backstop and deadline:
                backstop(deadline + backstop_sec)
            result_json = dumps(execute(job_type, payload, ctx))
            check_result_json(job_type, result_json)  # one a Struct cannot carry would break reads of the job
            frame = encode_result(result_json.encode())
        except JobFailed as exc:
            # str(): a job may raise JobFailed with any code or message, and encode_failure needs text
            code, message = as_text(exc.code), as_text(exc.message)
            if code == "MEMORY_LIMIT":
                spent = True  # its heap may be left fragmented or full
                if memory_limit_mb:
                    message = f"{message}; the limit is {memory_limit_mb} MiB (CORRAL_JOB_MEMORY_LIMIT_MB)"
            frame = encode_failure(code, message)
        except MemoryError as exc:  # outside the job (its result was too large to encode)
            frame, spent = encode_failure("MEMORY_LIMIT", f"result: {exc!r}"), True
        except ValueError as exc:  # malformed payload JSON, or a result that is not JSON
            frame = encode_failure("ERROR", f"{type(exc).__name__}: {exc}")
        except BaseException as exc:  # sys.exit() inside a job is a failure, not an exit
            frame = encode_failure("ERROR", f"{type(exc).__name__}: {exc}")
            escaped = exc
        if backstop and deadline:
            backstop(0.0)
        if os.getpid() != own_pid:  # a process the job forked came back here: it must not answer, nor read
            _leave_fork(escaped, frame[0] == FAILED)
        if feed is not None:
            sys.stdout, sys.stderr = real
            for stream in streams:
                stream.finish()
        if not inherit:
            _restore_devices(own_devices)
        reusable = job_type in ours or state.restore()  # cwd, umask, environment, signals, limits, fds 1-2...
        done += 1
        final = bool(
            spent
            or not reusable  # something the job changed could not be put back
            or _children_left(before)  # ended as the runner exits (main), in its process group or not
            or _threads_left(threads_at_start, feed)
            or done == max_jobs
            or (max_rss_mb and _resident_mb() > max_rss_mb)
        )
        if final:
            frame = last(frame)
        try:
            if feed is None:
                _write_all(out_fd, frame)
            else:
                # Under the feed's lock: what is left goes live first, and nothing of this job after its answer.
                with feed.lock:
                    feed.flush()
                    _write_all(out_fd, with_output(frame, tail.data()))
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise  # the worker is gone (EPIPE): exit as ever
            os._exit(LOST_PIPES_EXIT)  # the job closed our pipe: say so the one way left, the exit status
        if final:
            return


def _leave_fork(exc: BaseException | None, failed: bool) -> None:
    """End a process that a job forked and that returned from the job (or raised out of it) into this
    loop, as a copy of the runner: it must neither answer for the job (its parent does) nor read the
    next request. It exits as a script would have: ``sys.exit``'s status, else 1 after a failure, else 0."""
    code = 1 if failed else 0
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    os._exit(code)


def live_feed(out_fd: int, output_bytes: int) -> LiveFeed:
    """The :class:`~runner.output.LiveFeed` of a runner that keeps ``output_bytes`` of what each job
    prints: it writes ``PRINTED`` frames to ``out_fd`` (the pool's end of the pipe reads them)."""

    def send(offset: int, text: str) -> None:
        _write_all(out_fd, encode_printed(offset, text))

    return LiveFeed(PrintTail(output_bytes), send)


def _show_devices(devices: str) -> str | None:
    """Set CUDA_VISIBLE_DEVICES to ``devices`` (the job's GPUs; empty: none) for the job and for the
    programs it starts; returns this process's own value (None: unset), for :func:`_restore_devices`."""
    own = os.environ.get(DEVICES_ENV)
    os.environ[DEVICES_ENV] = devices
    return own


def _restore_devices(own: str | None) -> None:
    """Put this process's own CUDA_VISIBLE_DEVICES back after a job."""
    if own is None:
        os.environ.pop(DEVICES_ENV, None)
    else:
        os.environ[DEVICES_ENV] = own


def catalog() -> bytes:
    """The job types this process runs, built-ins and plug-ins, as the body of its READY frame:
    ``[{"name", "schema", "description"}, ...]``. The worker registers them with the control plane
    from here, so that plug-in code runs in runner processes only, never in the worker itself."""
    types = [{"name": t.name, "schema": t.schema, "description": t.description} for t in all_types()]
    return json.dumps(types, separators=(",", ":")).encode()


def _resident_mb() -> float:
    """This process's resident memory now, in MiB."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE") / (1 << 20)
    except OSError:  # no /proc: the peak, which only grows, is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _children_left(before: set[int]) -> bool:
    """Whether a process that a job started still runs after the job ended (reaping any that ended);
    ``before``: the children there were before any job ran.

    It would outlive its job and run on under the next ones; a runner that has one exits after its
    answer, ending it (and whatever it started, by pid: see :func:`main`) as it goes, and the worker
    starts a fresh runner. One ``wait4`` call when no child runs at all. Only children count: the
    runner adopts orphans, so what a job's processes leave when they exit is its child too.
    """
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return bool(children() - before)


def _threads_left(before: set[threading.Thread], feed: LiveFeed | None) -> bool:
    """Whether a thread that a job started still runs after the job ended; ``before``: the threads
    there were when it started.

    It would run on under the next jobs, and what it prints would land in their output (``sys.stdout``
    is swapped for the whole process). A runner that has one exits after its answer: a daemon thread
    ends with it, and a non-daemon one, which its exit waits for, is killed with it by the worker.
    """
    own = None if feed is None else feed.thread  # started at a job's first print, for good: ours
    return any(t not in before and t is not own and t.is_alive() for t in threading.enumerate())


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m runner.serve`` (started by the worker's pool, not by people)."""
    parser = argparse.ArgumentParser(prog="python -m runner.serve", description=__doc__)
    parser.add_argument("--in", dest="in_fd", type=int, required=True, help="request pipe fd")
    parser.add_argument("--out", dest="out_fd", type=int, required=True, help="response pipe fd")
    parser.add_argument("--parent", type=int, required=True, help="pid of the worker that started us")
    parser.add_argument("--import", dest="imports", action="append", default=[], help="plug-in module")
    parser.add_argument(
        "--memory-limit-mb", type=int, default=0, help="MiB a job may allocate beyond the idle process (0: no limit)"
    )
    parser.add_argument(
        "--open-files", type=int, default=0, help="the soft open-file limit jobs get (0: the one inherited)"
    )
    parser.add_argument("--max-jobs", type=int, default=0, help="exit after this many jobs (0: never)")
    parser.add_argument("--max-rss-mb", type=int, default=0, help="exit after a job that left us this large (0: never)")
    parser.add_argument("--output-bytes", type=int, default=0, help="keep this much of what each job prints (0: none)")
    parser.add_argument(
        "--threads", type=int, default=0, help="the most threads a job gets, started ahead (0: one per CPU)"
    )
    parser.add_argument(
        "--backstop-sec",
        type=float,
        default=0.0,
        help="end a job still running this long past its deadline, with what it started (0: never)",
    )
    args = parser.parse_args(argv)
    end_group_at = die_with_parent(args.parent)
    # Before the plug-ins load: what they leave in the background as they import is then among the
    # children serve() counts as theirs, not a job's.
    adopt_orphans()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_std_streams_open()  # a job that closes one must not break the prints of the jobs after it
    # Far from the descriptors jobs open, close and dup2 over, and never handed to their subprocesses
    # (which would hold them open): see runner.procstate.
    args.in_fd = move_high(args.in_fd)
    args.out_fd = move_high(args.out_fd)
    os.set_inheritable(args.in_fd, False)
    os.set_inheritable(args.out_fd, False)
    own_pid = os.getpid()
    try:
        _run(args, end_group_at)
    finally:
        # However the loop ended (end of file, a last answer, a plug-in that did not import, an error),
        # what jobs and plug-ins started ends with the process, in its group or out of it: the worker's
        # killpg after the exit reaches the group only. (A copy a job forked never gets here.)
        if os.getpid() == own_pid:
            end_descendants()


def _run(args: argparse.Namespace, end_group_at: Callable[[float], None] | None) -> None:
    """Import the plug-ins, get ready (threads, memory limit), and serve until the end; exits 2 when a
    plug-in does not import, 0 at the end."""
    try:
        load_plugins(args.imports)
    except ImportError as exc:  # said before READY: the worker reports it and exits 2, as for a bad setting
        _write_all(args.out_fd, encode_failure(PLUGIN_IMPORT, str(exc)))
        sys.exit(2)
    # As many as a job may use: under a memory limit, threads a job's kernel starts later would take
    # their stacks from what the job may allocate, and libgomp ends the process when it cannot start one.
    # (At least one per CPU, as before: plug-in code may use the kernels' default, one per CPU.)
    warm_up_threads(max(args.threads, os.cpu_count() or 1, 2))
    if args.open_files > 0:  # the limit the worker was started with, which it raised for itself
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    feed = live_feed(args.out_fd, args.output_bytes) if args.output_bytes > 0 else None
    if args.memory_limit_mb > 0:
        if feed is not None:
            feed.start()  # its thread's stack and arena are then part of the idle footprint, as the kernels'
        apply_memory_limit(args.memory_limit_mb)
    with os.fdopen(args.in_fd, "rb", buffering=1 << 16) as requests:
        serve(
            requests,
            args.out_fd,
            args.memory_limit_mb,
            args.max_jobs,
            args.max_rss_mb,
            args.output_bytes,
            feed,
            end_group_at,
            args.backstop_sec,
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
