"""What a job prints: its ``sys.stdout`` and ``sys.stderr`` writes, caught while it runs, the end kept.

A worker started with ``CORRAL_JOB_OUTPUT_BYTES=N`` (default 64 KiB; 0: not caught) gives each runner
``--output-bytes N``. While a job runs, ``sys.stdout`` and ``sys.stderr`` are :class:`PrintStream` s
writing, interleaved as on a terminal, into one :class:`PrintTail` that keeps the last N bytes (made
once per runner, cleared for each job). The text travels with the job's answer
(:func:`runner.wire.with_output`) and is stored as the attempt's ``output``. A job that prints
nothing costs a clear and two attribute swaps.

Only Python-level writes are caught. What C code or a child process writes to the file descriptors
goes, as before, to the worker's stderr: ``fileno()`` answers with the real descriptor, so that
``subprocess.run(..., stdout=sys.stdout)`` keeps working.
"""

from __future__ import annotations

import io

__all__ = ["PrintStream", "PrintTail"]


class PrintTail:
    """The last ``limit`` bytes (about: counted in characters until the end) of what was written."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chars = 0
        """Characters written in all."""
        self._parts: list[str] = []
        self._kept = 0

    def clear(self) -> None:
        """Forget everything (a new job starts)."""
        self.chars = 0
        self._parts.clear()
        self._kept = 0

    def add(self, text: str) -> None:
        self.chars += len(text)
        self._parts.append(text)
        self._kept += len(text)
        # Trimmed past twice the limit only, so that many small writes stay linear.
        if self._kept > 2 * self.limit:
            joined = "".join(self._parts)[-self.limit :]
            self._parts = [joined]
            self._kept = len(joined)

    def data(self) -> bytes:
        """The kept end as UTF-8, at most ``limit`` bytes, with a first line saying how much was cut."""
        if not self._parts:
            return b""
        text = "".join(self._parts)
        encoded = text.encode("utf-8", "replace")
        if len(encoded) <= self.limit and self.chars == len(text):
            return encoded
        kept = encoded[-self.limit :].decode("utf-8", "ignore")  # a character cut at the start is dropped
        note = f"[... {self.chars - len(kept)} characters before this were cut]\n"
        return (note + kept).encode("utf-8")


class PrintStream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` while a job runs: text goes to a :class:`PrintTail`."""

    def __init__(self, tail: PrintTail, fd: int) -> None:
        super().__init__()
        self._tail = tail
        self._fd = fd

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self._tail.add(s)
        return len(s)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        """The real stream's descriptor (a child process given ``sys.stdout`` writes there)."""
        return self._fd

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"
