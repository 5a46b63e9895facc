"""RunnerProcess: one pre-started runner process and the two pipes the pool talks to it through.

The process runs ``python -m runner.serve`` (see :mod:`runner.serve` for its side). This module only
moves bytes and watches the process; what the bytes mean for jobs is the pool's business:

* requests go out with one non-blocking ``os.write``; a frame bigger than the pipe's buffer is
  finished by a writer callback;
* responses are read by an event-loop reader on the pipe and cut into :mod:`runner.wire` frames,
  each handed to ``on_frame`` (no threads, no per-frame allocation beyond the bytes themselves);
* a frame that cannot be one (an unknown kind or flag, a size past what a runner ever sends, a second
  READY) means the pipe carries bytes a job wrote to it: the process is killed at once (:attr:`garbled`
  says why), rather than its answer waited for until the job's deadline, or parsed out of the garbage;
* exit is seen through a pidfd (Linux >= 5.3), which becomes readable the moment the process is a
  zombie; its process group is killed then (what its jobs left in it), the process is reaped there and
  ``on_exit`` runs after any last frames were delivered. What left the group is not this module's: the
  runner ends it as it exits, or the pool, when it comes to the worker (:mod:`worker.strays`);
* the process is known as a runner (:func:`worker.strays.starting_runner`) from its start until it is
  reaped, so that no sweep for strays takes it for one.

Processes are started from the event loop's thread. That matters: ``PR_SET_PDEATHSIG`` fires when the
*thread* that forked the child ends, so a child forked from a short-lived executor thread would be
killed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence

from corral import open_files
from corral.limits import MAX_ERROR_CODE, MAX_ERROR_MESSAGE_BYTES, MAX_RESULT_BYTES
from runner.output import WINDOW_CHARS
from runner.wire import FAILED, LAST, OK, OUTPUT, PRINTED, PRINTED_OFFSET, READY, RESPONSE
from worker import strays

__all__ = ["RunnerProcess", "describe_exit"]

_MAX_READY_BODY = 64 << 20
"""The largest READY (or start failure) frame taken: the catalog of every job type, schemas included."""
_MAX_CODE = 4 * MAX_ERROR_CODE  # characters of UTF-8
_MAX_PRINTED_BODY = PRINTED_OFFSET.size + 4 * WINDOW_CHARS
_SLACK = 64 << 10
"""Room over the exact sizes (the note of what was cut, the length fields) in the bounds of a frame."""

_READ_SIZE = 1 << 16
"""Bytes asked for per read of a runner's answers: a pipe holds 64 KiB, so one read never returns more.
More costs a syscall triple per answer: CPython allocates the whole size first, and glibc's malloc
serves a block over its mmap threshold (128 KiB by default) with mmap, then mremap to shrink it to
what came, then munmap (measured: +15% of the worker agent's CPU per noop job). A process that had
once freed a large block, such as one that imported numpy, hid that by raising the threshold."""


class RunnerProcess:
    """One runner process; call :meth:`spawn` once, then :meth:`send` frames to it."""

    __slots__ = (
        "_buffer",
        "_loop",
        "_max_answer",
        "_on_exit",
        "_on_frame",
        "_out_fd",
        "_pending",
        "_pidfd",
        "_popen",
        "_req_fd",
        "_wanted",
        "exited",
        "fresh",
        "garbled",
        "pid",
        "ready",
        "retired",
        "returncode",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_frame: Callable[[RunnerProcess, int, int, bytes, bytes], None],
        on_exit: Callable[[RunnerProcess], None],
    ) -> None:
        """Prepare (not start) a process; ``on_frame(proc, kind, flags, code, body)`` and ``on_exit(proc)``."""
        self._loop = loop
        self._on_frame = on_frame
        self._on_exit = on_exit
        self._buffer = bytearray()
        self._wanted = 0  # bytes the buffer needs before the frame in it is whole
        self._pending = b""
        self._popen: subprocess.Popen[bytes] | None = None
        self._req_fd = -1
        self._out_fd = -1
        self._pidfd = -1
        self.pid = 0
        self.ready = False
        """True once the process said READY."""
        self.retired = False
        """True once its answer said it was its last (it exits next, and is replaced)."""
        self.exited = False
        """True once the process has exited and was reaped."""
        self.fresh = True
        """True until it is handed a job on a worker with GPUs (the pool gives a GPU job a fresh one if
        it can: CUDA, once a job started it here, keeps the devices that job saw)."""
        self.returncode: int | None = None
        """The exit status (negative: killed by that signal) once exited."""
        self.garbled = ""
        """Why its answer pipe was found to carry something other than frames (it was killed then); empty
        while all is well."""
        self._max_answer = MAX_RESULT_BYTES + MAX_ERROR_MESSAGE_BYTES + _SLACK

    def spawn(
        self,
        imports: Sequence[str],
        python: str = sys.executable,
        memory_limit_mb: int = 0,
        max_jobs: int = 0,
        max_rss_mb: int = 0,
        output_bytes: int = 0,
        threads: int = 0,
        backstop_sec: float = 0.0,
    ) -> None:
        """Start the process (from the loop's thread) and begin watching its pipe and its pidfd.

        ``memory_limit_mb`` > 0 limits what each job may allocate (see :mod:`runner.limits`);
        ``max_jobs`` and ``max_rss_mb`` > 0 retire the process after that many jobs or past that size;
        ``threads`` > 0 is the most threads a job gets there (0: one per CPU); ``backstop_sec`` > 0: the
        process ends a job (its group) still running that long past its deadline by itself.
        """
        self._max_answer = MAX_RESULT_BYTES + MAX_ERROR_MESSAGE_BYTES + max(0, output_bytes) + _SLACK
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        argv = [python, "-m", "runner.serve", "--in", str(req_r), "--out", str(resp_w), "--parent", str(os.getpid())]
        for module in imports:
            argv += ["--import", module]
        for flag, value in (
            ("--memory-limit-mb", memory_limit_mb),
            ("--max-jobs", max_jobs),
            ("--max-rss-mb", max_rss_mb),
            ("--output-bytes", output_bytes),
            ("--threads", threads),
            ("--backstop-sec", backstop_sec),
            ("--open-files", open_files.inherited() or 0),
        ):
            if value > 0:
                argv += [flag, str(value)]
        try:
            with strays.starting_runner() as started:
                self._popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=2,  # a job's prints end up in the worker's stderr, never in our pipe
                    pass_fds=(req_r, resp_w),
                    # Terminal signals go to the worker, which decides; and a session of its own is what
                    # tells its jobs' processes from the worker's own (worker.strays).
                    start_new_session=True,
                )
                started(self._popen.pid)
        except BaseException:
            for fd in (req_r, req_w, resp_r, resp_w):
                os.close(fd)
            raise
        finally:
            if self._popen is not None:
                os.close(req_r)
                os.close(resp_w)
        self.pid = self._popen.pid
        self._req_fd = req_w
        self._out_fd = resp_r
        os.set_blocking(req_w, False)
        os.set_blocking(resp_r, False)
        self._pidfd = os.pidfd_open(self.pid)
        self._loop.add_reader(resp_r, self._on_readable)
        self._loop.add_reader(self._pidfd, self._on_pidfd)

    def send(self, frame: bytes) -> None:
        """Write one request frame without blocking; a dead process is noticed by its exit, not here."""
        if self._pending:
            self._pending += frame
            return
        try:
            written = os.write(self._req_fd, frame)
        except BlockingIOError:
            written = 0
        except OSError:  # the process is gone (EPIPE) or its pipe closed: its exit reports it
            return
        if written < len(frame):
            self._pending = frame[written:]
            self._loop.add_writer(self._req_fd, self._on_writable)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process and to every process a job started from it, if it still exists.

        The runner leads a process group of its own (``start_new_session``), which a job's children
        join unless they leave it: a tool a job runs is stopped with the job, not left running
        orphaned. Until it is reaped the runner's pid (even a zombie's) names that group and no other.
        A process that left the group is not signalled here: it comes to the worker when the runner
        dies, and the pool ends it then (:mod:`worker.strays`).
        """
        if self.exited or self._popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def close_input(self) -> None:
        """Close the request pipe: an idle runner exits at the end of file."""
        if self._req_fd >= 0:
            if self._pending:
                self._loop.remove_writer(self._req_fd)
                self._pending = b""
            os.close(self._req_fd)
            self._req_fd = -1

    def _on_writable(self) -> None:
        try:
            written = os.write(self._req_fd, self._pending)
        except BlockingIOError:
            return
        except OSError:
            written = len(self._pending)
        self._pending = self._pending[written:]
        if not self._pending:
            self._loop.remove_writer(self._req_fd)

    def _on_readable(self) -> None:
        try:
            data = os.read(self._out_fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # end of file: the process is exiting; the pidfd tells when it is gone
            self._loop.remove_reader(self._out_fd)
            return
        if not self.garbled:
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        header = RESPONSE.size
        unpack = RESPONSE.unpack_from
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._wanted:  # a large frame still arriving: parse it once, when whole
                return
            data = bytes(buffer)
            buffer.clear()
        offset = 0
        end = len(data)
        wanted = header
        while end - offset >= header:
            kind, flags, code_len, body_len = unpack(data, offset)
            if (kind != OK or flags & ~(LAST | OUTPUT) or code_len or body_len > self._max_answer) and (
                wrong := self._not_a_frame(kind, flags, code_len, body_len)
            ):
                self._garble(wrong)
                return
            start = offset + header
            stop = start + code_len + body_len
            if stop > end:
                wanted = stop - offset
                break
            self._on_frame(self, kind, flags, data[start : start + code_len], data[start + code_len : stop])
            offset = stop
        if offset < end:
            buffer += memoryview(data)[offset:]
            self._wanted = wanted

    def _not_a_frame(self, kind: int, flags: int, code_len: int, body_len: int) -> str:
        """Why a header is not one a runner sends (empty: it is); the common OK answer is let through
        by :meth:`_feed` without this call."""
        limit = self._max_answer
        if kind == READY:
            if self.ready or flags or code_len:
                return "a second READY" if self.ready else "a READY with a code or flags"
            limit = _MAX_READY_BODY
        elif kind == PRINTED:
            if flags or code_len:
                return "a PRINTED frame with a code or flags"
            limit = _MAX_PRINTED_BODY
        elif kind == FAILED:
            if code_len > _MAX_CODE:
                return f"an error code of {code_len} bytes"
            if not self.ready:
                limit = _MAX_READY_BODY
        elif kind != OK:
            return f"a frame of unknown kind {kind}"
        elif code_len:
            return "an OK answer with an error code"
        if flags & ~(LAST | OUTPUT):
            return f"unknown flags {flags:#04x}"
        if body_len > limit:
            return f"a frame of {body_len} bytes, over the {limit} a runner sends"
        return ""

    def _garble(self, wrong: str) -> None:
        """Give up on a pipe that carries something other than frames: kill the process (its exit is
        reported as ever) and read nothing more from it."""
        self.garbled = f"{wrong} on its answer pipe"
        self._buffer.clear()
        self._wanted = 0
        if self._out_fd >= 0:
            self._loop.remove_reader(self._out_fd)
        self.signal(signal.SIGKILL)

    def _on_pidfd(self) -> None:
        assert self._popen is not None
        self._loop.remove_reader(self._pidfd)
        # Frames written just before the exit are still in the pipe: deliver them first.
        while self._out_fd >= 0 and not self.garbled:
            try:
                data = os.read(self._out_fd, _READ_SIZE)
            except OSError:
                data = b""
            if not data:
                break
            self._feed(data)
        # What its jobs started and left behind goes with it, while the zombie still holds the group's id.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.returncode = self._popen.wait()  # the pidfd is readable: it is a zombie, so this does not block
        strays.runner_reaped(self.pid)
        self.exited = True
        self._close_fds()
        self._on_exit(self)

    def _close_fds(self) -> None:
        self.close_input()
        if self._out_fd >= 0:
            self._loop.remove_reader(self._out_fd)
            os.close(self._out_fd)
            self._out_fd = -1
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


def describe_exit(returncode: int | None) -> str:
    """How a process ended, for people: "exit status 3" or "signal SIGSEGV"."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"
