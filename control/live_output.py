"""LiveOutput: what running attempts printed lately, for WatchOutput streams.

Workers forward what a running attempt prints a few times a second (``JobOutput``); the control plane
keeps none of it in the store (the end of it is stored with the attempt's result). For each running
job that printed, it keeps the last :data:`BACKLOG_CHARS` characters in memory, so that a watch that
starts while the job runs sees its recent lines first, and hands each piece to the job's listeners.
The backlog goes when the job leaves RUNNING, so memory is bounded by the running jobs that print.

Which attempt may add is checked by the caller (:meth:`control.sessions.WorkerSessions.printed`: the
worker that holds the lease, for the attempt it holds).
"""

from __future__ import annotations

from collections.abc import Callable

from corral.printed import OutputChunk

__all__ = ["BACKLOG_CHARS", "MAX_CHUNK_CHARS", "LiveOutput"]

BACKLOG_CHARS = 8 * 1024
"""The end of a running attempt's output that a new watch starts with."""
MAX_CHUNK_CHARS = 64 * 1024
"""Longest piece taken from a worker (its runners send at most 16 Ki characters at a time); the
start of a longer one is left out, as a runner leaves out what a job printed too fast."""


class LiveOutput:
    """Per running job: the backlog of its current attempt, and the listeners of its output."""

    def __init__(self) -> None:
        self._backlogs: dict[str, OutputChunk] = {}
        self._listeners: dict[str, list[Callable[[OutputChunk], None]]] = {}

    def add(self, job_id: str, attempt: int, offset: int, text: str) -> None:
        """Take a piece that attempt ``attempt`` of the job printed, ``offset`` characters in."""
        if len(text) > MAX_CHUNK_CHARS:
            offset += len(text) - MAX_CHUNK_CHARS
            text = text[-MAX_CHUNK_CHARS:]
        chunk = OutputChunk(attempt, offset, text)
        kept = self._backlogs.get(job_id)
        if kept is not None and kept.attempt == attempt and kept.end == offset:
            joined = kept.text + text
            cut = max(0, len(joined) - BACKLOG_CHARS)
            self._backlogs[job_id] = OutputChunk(attempt, kept.offset + cut, joined[cut:])
        else:  # a new attempt, or a gap: the backlog starts again here
            cut = max(0, len(text) - BACKLOG_CHARS)
            self._backlogs[job_id] = OutputChunk(attempt, offset + cut, text[cut:])
        for put in self._listeners.get(job_id, ()):
            put(chunk)

    def backlog(self, job_id: str) -> OutputChunk | None:
        """The end of what the job's running attempt printed so far (None: nothing yet)."""
        return self._backlogs.get(job_id)

    def stopped(self, job_id: str) -> None:
        """The job left RUNNING: forget its backlog (its attempt's output is stored with its result)."""
        self._backlogs.pop(job_id, None)

    def listen(self, job_id: str, put: Callable[[OutputChunk], None]) -> None:
        """Have ``put`` called with each piece the job prints from now on."""
        self._listeners.setdefault(job_id, []).append(put)

    def forget(self, job_id: str, put: Callable[[OutputChunk], None]) -> None:
        """Undo :meth:`listen`."""
        listeners = self._listeners.get(job_id)
        if listeners is None:
            return
        if put in listeners:
            listeners.remove(put)
        if not listeners:
            del self._listeners[job_id]

    def __len__(self) -> int:
        """Running jobs with a backlog."""
        return len(self._backlogs)
