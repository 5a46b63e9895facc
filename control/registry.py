"""The worker registry: who is connected, what each can take, and when each was last heard from.

A worker's capacity is counted in slots (jobs at once) and threads. The registry tracks which
attempts each worker holds, so capacity comes back exactly when the worker reports that attempt
done, whatever happened to the job meanwhile (cancelled, expired): the worker's own word is what
frees its process.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from control.clock import Clock

AttemptKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Assignment:
    """One attempt handed to a worker."""

    job_id: str
    attempt: int
    type: str
    payload_json: str
    threads: int
    timeout_sec: float


class WorkerLink(Protocol):
    """The control plane's side of one worker's stream (implemented by the gRPC layer)."""

    def assign(self, assignments: list[Assignment]) -> None: ...

    def cancel(self, job_id: str, attempt: int) -> None: ...

    def ack(self, attempts: list[AttemptKey]) -> None: ...

    def drain(self, deadline_sec: float) -> None: ...

    def close(self) -> None: ...


class WorkerState(enum.IntEnum):
    """Values equal the proto's ``Worker.State``."""

    AVAILABLE = 1
    BUSY = 2
    DRAINING = 3
    UNAVAILABLE = 4


@dataclass(slots=True, eq=False)
class WorkerEntry:
    """One worker as the control plane sees it."""

    id: str
    threads: int
    slots: int
    registered_at: float
    last_seen: float
    hostname: str = ""
    pid: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    heard_at: float = 0.0
    """When it was last heard from, on the monotonic clock: what staleness is judged by, so that a
    step of the system time neither reaps live workers nor keeps dead ones (``last_seen`` is for people)."""
    link: WorkerLink | None = None
    draining: bool = False
    running: dict[AttemptKey, int] = field(default_factory=dict)
    last_assigned_at: float = 0.0
    jobs_completed: int = 0
    jobs_failed: int = 0
    job_types: frozenset[str] = frozenset()
    """The job types it can run, as it registered them (empty: it did not say, so any)."""

    @property
    def connected(self) -> bool:
        return self.link is not None

    @property
    def free_slots(self) -> int:
        return self.slots - len(self.running)

    @property
    def free_threads(self) -> int:
        return self.threads - sum(self.running.values())

    @property
    def state(self) -> WorkerState:
        if not self.connected:
            return WorkerState.UNAVAILABLE
        if self.draining:
            return WorkerState.DRAINING
        return WorkerState.AVAILABLE if self.free_slots > 0 else WorkerState.BUSY

    @property
    def accepts_work(self) -> bool:
        return self.link is not None and not self.draining and self.free_slots > 0

    def heard(self, clock: Clock) -> None:
        """Note a sign of life now."""
        self.last_seen = clock.now()
        self.heard_at = clock.monotonic()

    def can_take(self, threads: int) -> bool:
        return self.accepts_work and self.free_threads >= threads

    def runs(self, job_type: str) -> bool:
        """Whether it can run jobs of ``job_type`` (its runners have that type registered)."""
        return not self.job_types or job_type in self.job_types


class WorkerRegistry:
    """Workers by id, in registration order (the order round-robin walks)."""

    def __init__(self) -> None:
        self._workers: dict[str, WorkerEntry] = {}
        self._max_threads = 0

    def __len__(self) -> int:
        return len(self._workers)

    def __contains__(self, worker_id: str) -> bool:
        return worker_id in self._workers

    def get(self, worker_id: str) -> WorkerEntry | None:
        return self._workers.get(worker_id)

    def all(self) -> list[WorkerEntry]:
        return list(self._workers.values())

    def add(self, entry: WorkerEntry) -> None:
        self._workers[entry.id] = entry
        self._refresh()

    def remove(self, worker_id: str) -> WorkerEntry | None:
        entry = self._workers.pop(worker_id, None)
        self._refresh()
        return entry

    def connected(self) -> list[WorkerEntry]:
        return [w for w in self._workers.values() if w.connected]

    @property
    def max_threads(self) -> int:
        """The most threads any connected worker has (0 when none is connected)."""
        return self._max_threads

    def _refresh(self) -> None:
        self._max_threads = max((w.threads for w in self._workers.values() if w.connected), default=0)

    def changed(self) -> None:
        """Call after a worker connects, disconnects or starts draining."""
        self._refresh()

    def has_capacity(self) -> bool:
        return any(w.accepts_work for w in self._workers.values())
