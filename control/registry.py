"""The worker registry: who is connected, what each can take, and when each was last heard from.

A worker's capacity is counted in slots (jobs at once) and threads, and in the GPUs and memory it
gives to jobs that ask for them. The registry tracks which
attempts each worker holds, so capacity comes back exactly when the worker reports that attempt
done, whatever happened to the job meanwhile (cancelled, expired): the worker's own word is what
frees its process.

It also keeps the workers that can be offered a job now (connected, not draining, a slot free), so
that a dispatch pass costs what it places, not the size of the fleet: with a thousand workers, a pass
that walked them all cost the control plane about eight times more per job than with two.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from control.clock import Clock

AttemptKey = tuple[str, int]

_ORDER = itertools.count()
"""Registration order: round-robin walks the workers by it."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """One attempt handed to a worker."""

    job_id: str
    attempt: int
    type: str
    payload_json: str
    threads: int
    timeout_sec: float
    gpus: int = 0


Needs = tuple[int, int]
"""What an attempt holds beyond its threads: (GPUs, memory in MiB)."""


class WorkerLink(Protocol):
    """The control plane's side of one worker's stream (implemented by the gRPC layer)."""

    def assign(self, assignments: list[Assignment]) -> None:
        """Send the worker attempts to start, once their leases are committed (messages may be coalesced)."""
        ...

    def cancel(self, job_id: str, attempt: int) -> None:
        """Tell the worker to stop attempt ``attempt`` of ``job_id`` now and report it CANCELLED."""
        ...

    def ack(self, attempts: list[AttemptKey]) -> None:
        """Tell the worker these results are committed, so it may forget them (not urgent: it may wait a little)."""
        ...

    def drain(self, deadline_sec: float) -> None:
        """Ask the worker to take nothing new, finish what it runs and leave; what still runs ``deadline_sec``
        seconds from now it kills and hands back."""
        ...

    def close(self) -> None:
        """End the stream: a newer one of the same worker replaced it, the worker was reaped, or the control
        plane is stopping."""
        ...


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
    drain_until: float | None = None
    """When an operator's drain (DrainWorker, or the autoscaler retiring it) ends, on the monotonic clock;
    None when none was asked. Kept while the worker is away, so that a reconnection does not undo it."""
    running: dict[AttemptKey, int] = field(default_factory=dict)
    last_assigned_at: float = 0.0
    jobs_completed: int = 0
    jobs_failed: int = 0
    job_types: frozenset[str] = frozenset()
    """The job types it can run, as it registered them (empty: it did not say, so any)."""
    order: int = field(default_factory=_ORDER.__next__)
    """Its place in registration order (set again when a registry adds a new id)."""
    gpus: int = 0
    """GPUs it gives to jobs."""
    memory_mb: int = 0
    """Memory (MiB) it gives to jobs."""
    holding: dict[AttemptKey, Needs] = field(default_factory=dict)
    """The GPUs and memory each of its attempts holds, for the attempts that hold any (most hold none)."""

    @property
    def connected(self) -> bool:
        """Whether its stream is open now. One that is not keeps its attempts until it reconnects or is reaped."""
        return self.link is not None

    @property
    def free_slots(self) -> int:
        """Slots its attempts do not take; below 0 while it holds more than it has (an entry rebuilt from the
        store at start-up has none until its worker reconnects, and a worker may come back with fewer)."""
        return self.slots - len(self.running)

    @property
    def free_threads(self) -> int:
        """Threads not granted to its attempts; below 0 while they hold more than it has (see :attr:`free_slots`)."""
        return self.threads - sum(self.running.values())

    @property
    def held_gpus(self) -> int:
        """GPUs its attempts hold."""
        return sum(gpus for gpus, _ in self.holding.values())

    @property
    def held_memory_mb(self) -> int:
        """Memory (MiB) its attempts hold."""
        return sum(memory_mb for _, memory_mb in self.holding.values())

    @property
    def free_gpus(self) -> int:
        """GPUs it gives to jobs that its attempts do not hold; below 0 while they hold more."""
        return self.gpus - self.held_gpus

    @property
    def free_memory_mb(self) -> int:
        """Memory (MiB) it gives to jobs that its attempts do not hold; below 0 while they hold more."""
        return self.memory_mb - self.held_memory_mb

    def has(self, gpus: int, memory_mb: int) -> bool:
        """Whether it gives jobs that many GPUs and that much memory in all (free or not)."""
        return self.gpus >= gpus and self.memory_mb >= memory_mb

    @property
    def state(self) -> WorkerState:
        """UNAVAILABLE when disconnected, else DRAINING, else BUSY with no slot free, else AVAILABLE (by slots
        alone: a worker with a slot free but no thread free is AVAILABLE)."""
        if not self.connected:
            return WorkerState.UNAVAILABLE
        if self.draining:
            return WorkerState.DRAINING
        return WorkerState.AVAILABLE if self.free_slots > 0 else WorkerState.BUSY

    @property
    def accepts_work(self) -> bool:
        """Whether it may be offered a job now: connected, not draining, a slot free (threads, GPUs and memory
        aside: see :meth:`can_take`)."""
        return self.link is not None and not self.draining and self.free_slots > 0

    def heard(self, clock: Clock) -> None:
        """Note a sign of life now."""
        self.last_seen = clock.now()
        self.heard_at = clock.monotonic()

    def room_for(self, needs: Needs) -> int:
        """How many jobs holding ``needs`` (GPUs, MiB) each it could start now, by its free slots, GPUs
        and memory (threads aside: those a job may be granted fewer of)."""
        if not self.accepts_work:
            return 0
        room = self.free_slots
        gpus, memory_mb = needs
        if gpus:
            room = min(room, max(0, self.free_gpus) // gpus)
        if memory_mb:
            room = min(room, max(0, self.free_memory_mb) // memory_mb)
        return room

    def can_take(self, threads: int, needs: Needs = (0, 0)) -> bool:
        """Whether it can start a job needing ``threads`` threads and ``needs`` (GPUs, MiB) now."""
        if not (self.accepts_work and self.free_threads >= threads):
            return False
        gpus, memory_mb = needs
        return (not gpus or self.free_gpus >= gpus) and (not memory_mb or self.free_memory_mb >= memory_mb)

    def runs(self, job_type: str) -> bool:
        """Whether it can run jobs of ``job_type`` (its runners have that type registered)."""
        return not self.job_types or job_type in self.job_types

    def matches(self, selector: tuple[tuple[str, str], ...]) -> bool:
        """Whether its labels include every ``(label, value)`` of a job's worker selector."""
        labels = self.labels
        return all(labels.get(key) == value for key, value in selector)


class Capacity(NamedTuple):
    """What the connected workers give jobs in all."""

    threads: int
    gpus: int
    memory_mb: int


class WorkerRegistry:
    """Workers by id, in registration order (the order round-robin walks).

    A worker's capacity changes only through this registry (:meth:`hold`, :meth:`release`, or
    :meth:`changed` after it connects, disconnects or starts draining), which keeps :meth:`open` exact.
    """

    def __init__(self) -> None:
        self._workers: dict[str, WorkerEntry] = {}
        self._open: dict[str, WorkerEntry] = {}
        self._most_threads: dict[str | tuple[str, tuple[tuple[str, str], ...], Needs], int] = {}
        self._capacity: Capacity | None = None

    def __len__(self) -> int:
        return len(self._workers)

    def __contains__(self, worker_id: str) -> bool:
        return worker_id in self._workers

    def get(self, worker_id: str) -> WorkerEntry | None:
        """The worker registered as ``worker_id``, connected or not, or None when there is none (it left after
        draining, or was reaped)."""
        return self._workers.get(worker_id)

    def all(self) -> list[WorkerEntry]:
        """Every worker, connected or not, in registration order; a new list, so the caller may remove workers
        while walking it."""
        return list(self._workers.values())

    def add(self, entry: WorkerEntry) -> None:
        """Register ``entry`` under its id and take in its capacity (:meth:`changed`). A new id goes last in
        registration order; adding again the entry :meth:`get` returned keeps its place."""
        if entry.id not in self._workers:
            entry.order = next(_ORDER)
        self._workers[entry.id] = entry
        self.changed(entry)

    def remove(self, worker_id: str) -> WorkerEntry | None:
        """Forget the worker ``worker_id``; returns its entry, or None when there was none. Closing its link and
        failing the attempts it held are left to the caller."""
        entry = self._workers.pop(worker_id, None)
        self._open.pop(worker_id, None)
        self._most_threads.clear()
        self._capacity = None
        return entry

    def connected(self) -> list[WorkerEntry]:
        """The workers whose stream is open now, draining or not, in registration order."""
        return [w for w in self._workers.values() if w.connected]

    def open(self) -> list[WorkerEntry]:
        """The workers a job can be offered to now (connected, not draining, a slot free), in
        registration order; as many as there are, not as many as the fleet has."""
        return sorted(self._open.values(), key=registration_order)

    def hold(self, worker: WorkerEntry, key: AttemptKey, threads: int, needs: Needs = (0, 0)) -> None:
        """``worker`` runs attempt ``key`` with ``threads`` threads and ``needs`` (GPUs, MiB)."""
        worker.running[key] = threads
        if needs != (0, 0):
            worker.holding[key] = needs
        self._recheck(worker)

    def release(self, worker: WorkerEntry, key: AttemptKey) -> None:
        """``worker`` no longer runs attempt ``key`` (it reported it)."""
        if worker.running.pop(key, None) is not None:
            worker.holding.pop(key, None)
            self._recheck(worker)

    def hold_only(self, worker: WorkerEntry, running: dict[AttemptKey, int], needs: dict[AttemptKey, Needs]) -> None:
        """``worker`` runs exactly ``running`` (attempt -> threads), of which those in ``needs`` hold
        GPUs and memory: what a reconnecting worker says it still runs."""
        worker.running = running
        worker.holding = {key: n for key, n in needs.items() if key in running and n != (0, 0)}
        self._recheck(worker)

    def most_threads(self, job_type: str, selector: tuple[tuple[str, str], ...] = (), needs: Needs = (0, 0)) -> int:
        """The most threads a connected worker that runs ``job_type`` (matches ``selector``, and gives
        jobs the GPUs and memory of ``needs`` in all) has; 0 when none does."""
        key = (job_type, selector, needs) if selector or needs != (0, 0) else job_type
        most = self._most_threads.get(key)
        if most is None:
            most = self._most_threads[key] = max(
                (
                    w.threads
                    for w in self._workers.values()
                    if w.connected and w.runs(job_type) and (not selector or w.matches(selector)) and w.has(*needs)
                ),
                default=0,
            )
        return most

    def capacity(self) -> Capacity:
        """The threads, GPUs and memory of the connected workers, in all."""
        if self._capacity is None:
            connected = self.connected()
            self._capacity = Capacity(
                sum(w.threads for w in connected), sum(w.gpus for w in connected), sum(w.memory_mb for w in connected)
            )
        return self._capacity

    def _recheck(self, worker: WorkerEntry) -> None:
        if worker.accepts_work and self._workers.get(worker.id) is worker:
            self._open[worker.id] = worker
        else:
            self._open.pop(worker.id, None)

    def changed(self, worker: WorkerEntry) -> None:
        """Call after ``worker`` connected, disconnected or started draining."""
        self._most_threads.clear()
        self._capacity = None
        self._recheck(worker)

    def has_capacity(self) -> bool:
        """Whether any worker can be offered a job now (:meth:`open` is not empty)."""
        return bool(self._open)


def registration_order(worker: WorkerEntry) -> int:
    """Sort key: the order in which workers registered (the order round-robin walks)."""
    return worker.order
