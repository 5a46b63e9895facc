"""What a job prints: its ``sys.stdout`` and ``sys.stderr`` writes, caught while it runs, the end kept
and sent live.

A worker started with ``CORRAL_JOB_OUTPUT_BYTES=N`` (default 64 KiB; 0: not caught) gives each runner
``--output-bytes N``. While a job runs, ``sys.stdout`` and ``sys.stderr`` are :class:`PrintStream` s
writing, interleaved as on a terminal, into one :class:`PrintTail` that keeps the last N bytes (made
once per runner, cleared for each job). The text travels with the job's answer
(:func:`runner.wire.with_output`) and is stored as the attempt's ``output``.

So that users can follow a job as it runs, the streams write through a :class:`LiveFeed`, which also
sends what was printed lately as ``PRINTED`` frames (:func:`runner.wire.encode_printed`): at most
every :data:`WINDOW_SEC`, at most :data:`WINDOW_CHARS` characters each, the latest. Live output is a
view, not the record: a job that prints faster loses the middle of each window live (the frame's
offset says how much), and the stored end is what stays. The feed's thread starts with the first
print; a job that prints nothing costs a clear, two attribute swaps and the uncontended lock of its
ending, as it did without live output.

Only Python-level writes are caught: text, and bytes written to ``sys.stdout.buffer`` (a
:class:`PrintBuffer`, decoded as UTF-8 with invalid bytes replaced into the same tail); ``reconfigure()``
is accepted and changes nothing, the text being kept as written. What C code or a child process writes
to the file descriptors goes, as before, to the worker's stderr: ``fileno()`` answers with the real
descriptor, so that ``subprocess.run(..., stdout=sys.stdout)`` keeps working.
"""

from __future__ import annotations

import codecs
import io
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from corral.printed import cut_note

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["WINDOW_CHARS", "WINDOW_SEC", "LiveFeed", "PrintBuffer", "PrintStream", "PrintTail", "keep_std_streams_open"]

WINDOW_SEC = 0.2
"""How long printed text waits before it is sent live: what a job prints meanwhile goes in one frame."""
WINDOW_CHARS = 16 * 1024
"""The most characters sent live per window, the latest (the contract's ``JobOutput`` limit)."""


class PrintTail:
    """The last ``limit`` bytes (about: counted in characters until the end) of what was written."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chars = 0
        """Characters written since the last :meth:`clear`."""
        self._parts: list[str] = []
        self._kept = 0

    def clear(self) -> None:
        """Forget everything (a new job starts)."""
        self.chars = 0
        self._parts.clear()
        self._kept = 0

    def add(self, text: str) -> None:
        """Keep ``text``, written after what came before."""
        self.chars += len(text)
        self._parts.append(text)
        self._kept += len(text)
        # Trimmed past twice the limit only, so that many small writes stay linear.
        if self._kept > 2 * self.limit:
            joined = "".join(self._parts)[-self.limit :]
            self._parts = [joined]
            self._kept = len(joined)

    def take(self) -> tuple[int, str]:
        """``(offset, text)``: the end (at most ``limit`` characters) of what was written since the last
        take, and the characters written before it since the last :meth:`clear`. The text is forgotten;
        :attr:`chars` keeps counting, so that the next offset shows what was left out."""
        text = "".join(self._parts)
        if len(text) > self.limit:
            text = text[len(text) - self.limit :]
        self._parts.clear()
        self._kept = 0
        return self.chars - len(text), text

    def data(self) -> bytes:
        """The kept end as UTF-8, at most ``limit`` bytes, with a first line saying how much was cut."""
        if not self._parts:
            return b""
        text = "".join(self._parts)
        encoded = text.encode("utf-8", "replace")
        if len(encoded) <= self.limit and self.chars == len(text):
            return encoded
        kept = encoded[-self.limit :].decode("utf-8", "ignore")  # a character cut at the start is dropped
        return (cut_note(self.chars - len(kept)) + kept).encode("utf-8")


class LiveFeed:
    """Writes to a job's :class:`PrintTail` and sends what was printed lately with ``send(offset, text)``.

    The first write after a send wakes a flusher thread, which waits :data:`WINDOW_SEC` (what is printed
    meanwhile joins the same frame) and sends the end of it, at most :data:`WINDOW_CHARS` characters.
    ``send`` runs with :attr:`lock` held; a send that blocks (a full pipe) holds up the job's next
    print, which is the back-pressure wanted. The runner ends a job holding :attr:`lock`: it calls
    :meth:`flush` and writes the job's answer, so no live text of a job goes after its answer.
    """

    def __init__(self, tail: PrintTail, send: Callable[[int, str], None]) -> None:
        """A feed into ``tail`` (the job's stored end); nothing runs until the first :meth:`add`."""
        self.tail = tail
        self.lock = threading.RLock()
        """Held while a tail changes or a frame goes out. Reentrant: a job's signal handler that prints
        while the interrupted code is inside :meth:`add` must not deadlock."""
        self._send = send
        self._window = PrintTail(WINDOW_CHARS)
        self._pending = False  # text in the window that a flush will send
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._forked = False
        os.register_at_fork(after_in_child=self._after_fork)

    def add(self, text: str) -> None:
        """Keep ``text`` in the tail and send it within :data:`WINDOW_SEC`."""
        if not text:
            return
        with self.lock:
            self.tail.add(text)
            if self._forked:
                return
            self._window.add(text)
            if self._pending:
                return  # the flush that is due sends it too
            self._pending = True
            if self._thread is None:
                self.start()
            # Set after _pending, under the lock: the flusher clears the event before it takes the lock
            # to flush, so a wake-up is never lost, at worst spent on a window already flushed.
            self._wake.set()

    @property
    def thread(self) -> threading.Thread | None:
        """The flusher thread, once started: the runner's own, not one a job left running."""
        return self._thread

    def start(self) -> None:
        """Start the flusher thread now rather than at the first print (idempotent): a runner under a
        memory limit starts it before the limit, so that its stack (8 MiB) and malloc arena (up to 64 MiB
        of address space) count in the idle footprint, not against a job."""
        with self.lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._flusher, name="corral-live-output", daemon=True)
                self._thread.start()

    def flush(self) -> None:
        """Send what waits now; call with :attr:`lock` held (the runner then writes the job's answer)."""
        if not self._pending:
            return
        self._pending = False
        offset, text = self._window.take()
        if text:
            self._send(offset, text)

    def clear(self) -> None:
        """Forget what was printed (a new job starts): its offsets count from 0."""
        with self.lock:
            self.tail.clear()
            self._window.clear()
            self._pending = False

    def _flusher(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            time.sleep(WINDOW_SEC)
            with self.lock:
                try:
                    self.flush()
                except OSError:  # the worker is gone: the runner finds out on its next read
                    return

    def _after_fork(self) -> None:
        # A child a job forks (multiprocessing) must not write frames on its parent's pipe, where they
        # would interleave with the parent's, nor wait on a lock held at the fork: it keeps a tail only.
        self.lock = threading.RLock()
        self._forked = True


class _JobStream:
    """What a job's text stream and the binary one under it answer alike."""

    _fd: int

    def writable(self) -> bool:
        """Always True: a job may write (and only write) to it."""
        return True

    def fileno(self) -> int:
        """The real stream's descriptor (a child process given ``sys.stdout`` or its ``buffer`` writes there)."""
        return self._fd

    def isatty(self) -> bool:
        """Always False: the text is kept, not shown, so libraries that check write no colour codes or redraws."""
        return False

    def close(self) -> None:
        """Accepted, and closes nothing: the runner's streams serve every job it runs, so a job that
        closes one, or drops a wrapper over it (``io.TextIOWrapper(sys.stdout.buffer)`` closes the buffer
        as it is collected), must not leave it closed under the next jobs, whose prints would fail."""


class PrintBuffer(_JobStream, io.BufferedIOBase):
    """``sys.stdout.buffer`` or ``sys.stderr.buffer`` while a job runs: bytes are decoded (UTF-8, invalid
    bytes replaced) into the text of its :class:`PrintStream`, in order with it.

    Decoding is incremental, so a character split across two writes (a copy in chunks) comes out whole;
    bytes of a character still unfinished when the job ends are kept as one U+FFFD (:meth:`finish`).
    """

    def __init__(self, add: Callable[[str], None], fd: int) -> None:
        """A binary stream whose decoded text goes to ``add``; ``fd``: the real stream's descriptor."""
        super().__init__()
        self._add = add
        self._fd = fd
        # No lock: the decoder holds bytes between writes only for a character split across them, and
        # threads that write such pieces at once garble them on a real stream too.
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, b: ReadableBuffer, /) -> int:
        """Keep the text of the bytes-like ``b``; returns its length in bytes."""
        data = memoryview(b).tobytes()  # a str is refused here, as by a real binary stream
        text = self._decoder.decode(data)
        if text:
            self._add(text)
        return len(data)

    def finish(self) -> None:
        """End a job's bytes: an unfinished character is kept as U+FFFD, and nothing of it carries into
        the next job's text."""
        text = self._decoder.decode(b"", final=True)
        if text:
            self._add(text)


class PrintStream(_JobStream, io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` while a job runs: text goes to a :class:`PrintTail`, or through a
    :class:`LiveFeed`; bytes written to its :attr:`buffer` join it."""

    def __init__(self, tail: PrintTail, fd: int, feed: LiveFeed | None = None) -> None:
        """A stream into ``tail``, or through ``feed`` (whose tail it is) to send it live too; ``fd``:
        the real stream's descriptor."""
        super().__init__()
        self._add = tail.add if feed is None else feed.add
        self._fd = fd
        self._buffer = PrintBuffer(self._add, fd)

    @property
    def buffer(self) -> PrintBuffer:
        """The binary stream under this one, as a real ``sys.stdout`` has (``sys.stdout.buffer.write(b"...")``)."""
        return self._buffer

    def finish(self) -> None:
        """End a job's output (see :meth:`PrintBuffer.finish`); the runner calls it as each job ends."""
        self._buffer.finish()

    def detach(self) -> PrintBuffer:  # type: ignore[override]
        """The binary stream under this one, as ``io.TextIOWrapper.detach`` gives it (a job that rewraps
        its output: ``sys.stdout = io.TextIOWrapper(sys.stdout.detach(), encoding="utf-8")``). This stream
        stays usable, unlike a real detached one: it serves the runner's later jobs too."""
        return self._buffer

    def reconfigure(
        self,
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
        line_buffering: bool | None = None,
        write_through: bool | None = None,
    ) -> None:
        """Accept what ``io.TextIOWrapper.reconfigure`` accepts, and change nothing: the text is kept as
        written (and sent as UTF-8), never buffered. An unknown encoding or newline is refused as there,
        so that a job behaves the same whether its output is caught or not."""
        if encoding is not None:
            codecs.lookup(encoding)  # LookupError
        if newline not in (None, "", "\n", "\r", "\r\n"):
            raise ValueError(f"illegal newline value: {newline!r}")

    def write(self, s: str) -> int:
        """Keep ``s`` (text only, as a real text stream)."""
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self._add(s)
        return len(s)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """``utf-8``: what the kept text is sent as (see :meth:`PrintTail.data`)."""
        return "utf-8"


class _KeptOpen(io.BufferedWriter):
    """A buffered writer that closing only flushes (see :func:`keep_std_streams_open`)."""

    def close(self) -> None:
        """Flush, and close nothing."""
        if not self.raw.closed:
            self.flush()


def keep_std_streams_open() -> None:
    """Make this process's ``sys.stdout`` and ``sys.stderr`` streams that closing only flushes.

    A runner's standard streams serve every job it runs (when their output is not caught, and a
    plug-in's prints otherwise). A job that closes one, or drops a wrapper over its buffer
    (``io.TextIOWrapper(sys.stdout.buffer)`` closes the buffer as it is collected), would otherwise leave
    it closed, and every later job of that runner that prints would fail. Each is replaced by a stream
    on the same descriptor, with the same encoding and buffering.
    """
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, io.TextIOWrapper) or stream.closed:
            continue
        stream.flush()
        buffer = _KeptOpen(io.FileIO(stream.fileno(), "w", closefd=False))
        kept = io.TextIOWrapper(
            buffer,
            encoding=stream.encoding,
            errors=stream.errors,
            line_buffering=stream.line_buffering,
            write_through=stream.write_through,
        )
        setattr(sys, name, kept)
