"""ScalePolicy: whether to add or remove workers, and how many. Pure: no I/O; time comes in as ``now``.

The signal, read every AUTOSCALE_INTERVAL (:class:`Snapshot`), is the backlog against free capacity:
the ready jobs (the queue depth), the threads they ask for (each capped at one worker's size), how long
the oldest has waited; and the free threads of the workers that take work plus those of the workers
still starting. The rules, first match wins:

1. Bounds: fewer workers than MIN_WORKERS -> up to it; more than MAX_WORKERS -> down to it.
2. Up: depth > QUEUE_THRESHOLD_HIGH (or the oldest ready job has waited CORRAL_SCALE_MAX_WAIT_SEC) and
   the backlog asks for more threads than are free or on the way -> up by
   ``ceil(missing threads / threads per worker)``, at most to MAX_WORKERS.
3. Down: depth < QUEUE_THRESHOLD_LOW with at least one whole worker idle (running no job) to spare and
   no worker still starting, without a break for SCALE_DOWN_STABLE_SEC -> down by the idle workers to
   spare, at most to MIN_WORKERS. (Free threads of busy workers are not spare: draining such a worker
   removes nothing until its jobs end. Capacity still starting is not spare either: it may be what the
   next look needs, and a worker that has not registered cannot be drained.)
4. After any action (:meth:`ScalePolicy.acted`), none for CORRAL_SCALE_COOLDOWN_SEC, the bounds
   included: at most one action per cooldown window, whatever happens.
5. While containers keep dying soon after they start (:attr:`Snapshot.held_sec`, from
   :class:`CrashBackoff`), no step up (rules 1 and 2): more of them would die the same way.

Workers drained by a scale-down and not gone yet (:attr:`Snapshot.retiring`) still run their jobs:
they count toward MAX_WORKERS in every step up (rules 1 and 2), and toward nothing else.

Why a load that comes and goes does not make it flap: between LOW and HIGH nothing happens
(hysteresis); capacity already starting counts as capacity, so one burst is answered once; a
scale-down needs the queue low *and* capacity idle for the whole stable period, and the period
restarts at the first sign of load; and every action opens a cooldown in which no other action
(either way) is taken. A square wave whose quiet phase is shorter than the stable period never
scales in at all.

:func:`choose_victims` picks the workers a scale-down drains: idle ones first, then the least loaded.
:class:`CrashBackoff` spaces out the starts that replace containers dying soon after they started.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Action",
    "CrashBackoff",
    "Decision",
    "ScalePolicy",
    "ScaleSettings",
    "Snapshot",
    "WorkerLoad",
    "choose_victims",
]


class Action(enum.StrEnum):
    """What a decision asks for."""

    UP = "up"
    DOWN = "down"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class ScaleSettings:
    """The policy's knobs (their environment variables are named in each docstring)."""

    min_workers: int = 1
    """MIN_WORKERS: >= 0."""
    max_workers: int = 10
    """MAX_WORKERS: >= max(1, min_workers)."""
    threshold_high: int = 10
    """QUEUE_THRESHOLD_HIGH: >= 1; depth above it asks for more workers."""
    threshold_low: int = 2
    """QUEUE_THRESHOLD_LOW: 0 <= low < high; depth below it (for the stable period) allows fewer."""
    stable_sec: float = 60.0
    """SCALE_DOWN_STABLE_SEC: >= 0."""
    cooldown_sec: float = 30.0
    """CORRAL_SCALE_COOLDOWN_SEC: >= 0."""
    max_wait_sec: float = 60.0
    """CORRAL_SCALE_MAX_WAIT_SEC: >= 0 (0: the oldest job's age is no trigger)."""
    threads_per_worker: int = 4
    """CORRAL_WORKER_THREADS: >= 1; the threads one added worker brings."""

    def __post_init__(self) -> None:
        """Check the rules (ControlConfig checks them too; this guards direct use)."""
        rules = (
            (self.min_workers >= 0, "MIN_WORKERS must be >= 0"),
            (self.max_workers >= max(1, self.min_workers), "MAX_WORKERS must be >= 1 and >= MIN_WORKERS"),
            (self.threshold_high >= 1, "QUEUE_THRESHOLD_HIGH must be >= 1"),
            (0 <= self.threshold_low < self.threshold_high, "QUEUE_THRESHOLD_LOW must be >= 0 and < HIGH"),
            (self.stable_sec >= 0, "SCALE_DOWN_STABLE_SEC must be >= 0"),
            (self.cooldown_sec >= 0, "CORRAL_SCALE_COOLDOWN_SEC must be >= 0"),
            (self.max_wait_sec >= 0, "CORRAL_SCALE_MAX_WAIT_SEC must be >= 0"),
            (self.threads_per_worker >= 1, "CORRAL_WORKER_THREADS must be >= 1"),
        )
        for ok, message in rules:
            if not ok:
                raise ValueError(f"{message}, got {self}")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the autoscaler saw at one look."""

    ready_jobs: int
    """PENDING jobs: the queue depth."""
    ready_threads: int
    """Threads those jobs ask for, each capped at ``threads_per_worker``."""
    oldest_ready_age: float
    """Seconds the oldest ready job has waited (0 when none)."""
    free_threads: int
    """Free threads of the connected workers that take work."""
    workers: int
    """The count MIN/MAX apply to: worker containers (running or starting, not being removed) in
    docker mode, connected workers that take work otherwise."""
    starting: int = 0
    """Of ``workers``, those started but not registered yet: their threads are on the way."""
    idle_workers: int = 0
    """Of ``workers``, those registered that take work and run no job: the only ones a scale-down
    removes (in docker mode, this group's containers only: no other worker can be removed)."""
    retiring: int = 0
    """Workers drained for removal and not gone yet (docker mode): not in ``workers``, but they may
    run their jobs up to the jobs' timeout, so they count toward MAX_WORKERS."""
    held_sec: float = 0.0
    """Seconds before a container may be started again, because containers died soon after they
    started (docker mode, :class:`CrashBackoff`): while > 0 there is no step up."""


@dataclass(frozen=True, slots=True)
class Decision:
    """One evaluation's outcome."""

    action: Action
    step: int
    """Workers to add or remove (0 for NONE)."""
    desired: int
    """``workers`` after the action."""
    reason: str
    """below_min | above_max | backlog | waiting | idle (actions); steady | cooldown | at_max |
    capacity_coming | stabilizing | crash_backoff (none)."""
    detail: str = ""
    """The numbers behind it, for the log and GET /v1/autoscaler."""

    def summary(self) -> str:
        """``up +2 (backlog: ...)`` / ``none (steady)``."""
        head = {Action.UP: f"up +{self.step}", Action.DOWN: f"down -{self.step}", Action.NONE: "none"}[self.action]
        return f"{head} ({self.reason}{': ' + self.detail if self.detail else ''})"


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A candidate for removal."""

    worker_id: str
    running_jobs: int
    running_threads: int


class ScalePolicy:
    """The rules of the module docstring, with the two bits of memory they need: when the queue
    became low (the stable period) and when the last action was taken (the cooldown)."""

    def __init__(self, settings: ScaleSettings) -> None:
        """Start with no cooldown running and no stable period begun."""
        self.settings = settings
        self.low_since: float | None = None
        self.last_action_at: float | None = None

    def decide(self, snap: Snapshot, now: float) -> Decision:
        """Evaluate one snapshot; call :meth:`acted` when an UP/DOWN decision is carried out."""
        cfg = self.settings
        cur = snap.workers
        cooling = self.last_action_at is not None and now - self.last_action_at < cfg.cooldown_sec
        room = cfg.max_workers - cur - snap.retiring
        if cur < cfg.min_workers or cur > cfg.max_workers:
            self.low_since = None
            bound = (
                f"{cur} workers + {snap.retiring} retiring, MIN_WORKERS {cfg.min_workers}, "
                f"MAX_WORKERS {cfg.max_workers}"
            )
            if cooling:
                return _none(cur, "cooldown", bound)
            if cur < cfg.min_workers:
                if room <= 0:
                    return _none(cur, "at_max", bound)
                if snap.held_sec > 0:
                    return _none(cur, "crash_backoff", f"{bound}; starts held {snap.held_sec:.0f}s more")
                return _up(cur, min(cfg.min_workers - cur, room), "below_min", bound)
            return _down(cur, cur - cfg.max_workers, "above_max", bound)

        tpw = cfg.threads_per_worker
        capacity = snap.free_threads + snap.starting * tpw
        missing = snap.ready_threads - capacity
        spare = snap.free_threads - snap.ready_threads
        spare_workers = min(snap.idle_workers, spare // tpw) if spare > 0 and snap.starting == 0 else 0
        over_high = snap.ready_jobs > cfg.threshold_high
        waited = cfg.max_wait_sec > 0 and snap.ready_jobs > 0 and snap.oldest_ready_age >= cfg.max_wait_sec
        low = snap.ready_jobs < cfg.threshold_low and not over_high and not waited
        numbers = (
            f"{snap.ready_jobs} ready jobs asking {snap.ready_threads} threads, oldest {snap.oldest_ready_age:.1f}s; "
            f"{snap.free_threads} free threads + {snap.starting} starting; {cur} workers "
            f"({snap.idle_workers} idle) + {snap.retiring} retiring"
        )

        # The stable period runs only while the queue is low and a whole idle worker is to spare.
        if low and spare_workers >= 1 and cur > cfg.min_workers:
            if self.low_since is None:
                self.low_since = now
        else:
            self.low_since = None

        if over_high or waited:
            if missing <= 0:
                return _none(cur, "capacity_coming", numbers)
            if room <= 0:
                return _none(cur, "at_max", numbers)
            if cooling:
                return _none(cur, "cooldown", numbers)
            if snap.held_sec > 0:
                return _none(cur, "crash_backoff", f"{numbers}; starts held {snap.held_sec:.0f}s more")
            step = min(math.ceil(missing / tpw), room)
            return _up(cur, step, "backlog" if over_high else "waiting", numbers)
        if self.low_since is not None:
            if now - self.low_since < cfg.stable_sec:
                return _none(cur, "stabilizing", numbers)
            if cooling:
                return _none(cur, "cooldown", numbers)
            step = min(spare_workers, cur - cfg.min_workers)
            return _down(cur, step, "idle", numbers)
        return _none(cur, "steady", numbers)

    def acted(self, now: float) -> None:
        """An UP/DOWN decision was carried out (or recommended): start the cooldown, restart the
        stable period."""
        self.last_action_at = now
        self.low_since = None

    def cooldown_left(self, now: float) -> float:
        """Seconds until an action may be taken again (0 when none is running)."""
        if self.last_action_at is None:
            return 0.0
        return max(0.0, self.settings.cooldown_sec - (now - self.last_action_at))


class CrashBackoff:
    """When a container may be started again after containers died soon after they started. Pure: time
    (a monotonic clock's seconds) comes in as ``now``.

    A worker whose image exits at start, or that cannot reach the control plane, dies the same way each
    time it is replaced; replacing it at every look would churn containers for ever. So the n-th such
    failure in a row holds every start for ``min(cap_sec, base_sec * 2**(n-2))``, none after the first
    (a one-off crash is replaced at once). The series ends when a container started after the last
    failure has stayed up ``stay_up_sec`` (:meth:`stayed_up`), or when no failure came for
    ``cap_sec + stay_up_sec`` (nothing was started meanwhile to prove the image good, nor to fail).
    """

    def __init__(self, base_sec: float = 10.0, cap_sec: float = 300.0, stay_up_sec: float = 60.0) -> None:
        """No failure yet: nothing is held."""
        self.base_sec = base_sec
        self.cap_sec = cap_sec
        self.stay_up_sec = stay_up_sec
        self.failures = 0
        """Failures in a row (the series)."""
        self.last_failure_at: float | None = None
        self.hold_until = 0.0

    def early(self, started_at: float, now: float) -> bool:
        """Whether a container started at ``started_at`` and dead at ``now`` died soon after it started."""
        return now - started_at < self.stay_up_sec

    def failed(self, now: float) -> float:
        """Record one failure (at most one per look: containers that die together are one failure);
        returns the seconds every start is now held for."""
        if self.last_failure_at is not None and now - self.last_failure_at > self.cap_sec + self.stay_up_sec:
            self.failures = 0
        self.failures += 1
        self.last_failure_at = now
        hold = 0.0 if self.failures == 1 else min(self.cap_sec, self.base_sec * 2 ** min(self.failures - 2, 30))
        self.hold_until = now + hold
        return hold

    def held(self, now: float) -> float:
        """Seconds before a container may be started (0: now)."""
        return max(0.0, self.hold_until - now)

    def failing(self, now: float) -> bool:
        """Whether a series that holds starts is going on: more than one failure in a row, and the last
        one recent enough to count (no container has stayed up since, or none was started)."""
        last = self.last_failure_at
        return self.failures > 1 and last is not None and now - last <= self.cap_sec + self.stay_up_sec

    def stayed_up(self, started_at: float, now: float) -> bool:
        """A container started at ``started_at`` runs a registered worker at ``now``: when it was started
        after the last failure and has been up ``stay_up_sec``, the series ends (returns True then)."""
        last = self.last_failure_at
        if self.failures == 0 or last is None or started_at < last or now - started_at < self.stay_up_sec:
            return False
        self.failures, self.last_failure_at, self.hold_until = 0, None, 0.0
        return True


def choose_victims(workers: Sequence[WorkerLoad], n: int) -> list[str]:
    """The ``n`` workers a scale-down should drain: idle ones first, then those running the fewest
    threads and jobs (ties by id, so the choice is deterministic)."""
    ranked = sorted(workers, key=lambda w: (w.running_jobs > 0, w.running_threads, w.running_jobs, w.worker_id))
    return [w.worker_id for w in ranked[: max(0, n)]]


def _up(cur: int, step: int, reason: str, detail: str) -> Decision:
    return Decision(Action.UP, step, cur + step, reason, detail)


def _down(cur: int, step: int, reason: str, detail: str) -> Decision:
    return Decision(Action.DOWN, step, cur - step, reason, detail)


def _none(cur: int, reason: str, detail: str) -> Decision:
    return Decision(Action.NONE, 0, cur, reason, detail)
