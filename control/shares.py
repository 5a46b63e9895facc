"""Owners' shares of the cluster: fair share between owners, a cap on each owner's running jobs, and
the thread-time each owner has used.

A job's owner is the client token it was submitted with (control.access); without auth every job has
the owner ``""``. Four settings:

* ``CORRAL_FAIR_SHARE=on``: when a slot frees, the next job comes from the owner with the smallest
  dominant share for its weight (``CORRAL_OWNER_WEIGHTS``, ``alice=3,bob=1``, default 1 each). An
  owner's dominant share is the largest part of the cluster's threads, GPUs or memory that its running
  jobs hold (dominant resource fairness): an owner whose one job holds every GPU has had its share,
  though it holds one thread. Without GPU or memory jobs that is the part of the threads it holds. With
  ``CORRAL_GROUPS`` the share is a group's: what all its owners' jobs hold, for the group's weight
  (``CORRAL_OWNER_WEIGHTS`` names groups then; an owner in no group is a group of one); within a
  group, the owner holding fewer threads goes first. Among owners equally far below their share, the
  one whose next job has the higher priority, then the older one, goes first; within an owner, jobs
  keep their order (priority, then age). So a client
  that queues ten thousand jobs gets its share of the workers, not all of them, and a client that
  submits one job later waits for one slot to free, not for the ten thousand. No owner starves: every
  owner with ready jobs is the least served one at some point. Priority orders an owner's own jobs;
  it does not let one owner take another's share.
* ``CORRAL_FAIR_SHARE_HALF_LIFE_SEC=H`` (with fair share; 0 or unset: off): a share is ranked by what it
  holds now plus what it held lately, an average of its dominant share over time in which what it
  held H seconds ago counts half, 2H ago a quarter, and so on. A group that had the whole cluster for
  the last hour, and a group that just came, split the freed slots in favour of the newcomer until the
  history evens out; between shares with the same history it is the plain rule above. The history
  lives here, in memory; control.share_history keeps a copy in the store across restarts.
* ``CORRAL_OWNER_MAX_RUNNING=N`` (or ``N,alice=M``; 0 = no cap): an owner never has more than that
  many jobs running; the rest wait PENDING and start as its running jobs end.
* Usage, always counted: the thread-seconds of every lease each owner's jobs held (threads granted x
  time leased, whatever the attempt's outcome), exported as ``corral_owner_thread_seconds_total``
  with ``corral_owner_running_jobs`` (control.metrics). Those counters count this process's leases
  (a restart is a counter reset, as Prometheus expects); the totals of earlier runs, kept with the
  history (control.share_history), are :attr:`OwnerUsage.used_before`, and ListShares shows both added.

Without either of the first two settings the scheduler keeps its one ready queue (control.queue) and
none of this costs anything but the usage count.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from control.jobs import JobRecord
from control.queue import STRICT, QueueOrder
from control.registry import Capacity

__all__ = ["OwnerQueues", "OwnerUsage", "ShareRow", "ShareRules", "parse_caps", "parse_weights"]

_Entry = tuple[float, float, int, str, int]  # (*rank, job id, token): see control.queue.QueueOrder


def _pairs(raw: str) -> Iterator[tuple[str, str]]:
    """``a=1, 2`` -> ("a", "1"), ("", "2"): comma-separated entries, each ``NAME=VALUE`` or ``VALUE``."""
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.rpartition("=")
        yield (name.strip() if sep else ""), value.strip()


def parse_weights(raw: str) -> dict[str, float]:
    """``alice=3,bob=0.5`` -> {owner: weight}; raises ValueError naming the entry and the rule."""
    weights: dict[str, float] = {}
    for name, value in _pairs(raw):
        if not name:
            raise ValueError(f"{value!r}: each entry is OWNER=WEIGHT")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"{name}={value}: the weight must be a number") from None
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"{name}={value}: the weight must be > 0")
        weights[name] = weight
    return weights


def parse_caps(raw: str) -> tuple[int, dict[str, int]]:
    """``4,alice=10`` -> (4, {"alice": 10}): the cap of every owner, and per-owner exceptions (0 = none);
    raises ValueError naming the entry and the rule."""
    default = 0
    caps: dict[str, int] = {}
    for name, value in _pairs(raw):
        try:
            cap = int(value)
        except ValueError:
            raise ValueError(f"{value!r}: a cap must be a whole number") from None
        if cap < 0:
            raise ValueError(f"{value!r}: a cap must be >= 0 (0: no cap)")
        if name:
            caps[name] = cap
        else:
            default = cap
    return default, caps


@dataclass(frozen=True)
class ShareRules:
    """CORRAL_FAIR_SHARE, CORRAL_OWNER_WEIGHTS and CORRAL_OWNER_MAX_RUNNING, parsed."""

    fair: bool = False
    weights: Mapping[str, float] = field(default_factory=dict)
    max_running: int = 0
    max_running_for: Mapping[str, int] = field(default_factory=dict)
    group_of: Mapping[str, str] = field(default_factory=dict)
    """CORRAL_GROUPS: owner -> group; fair share is between groups (an owner in none is its own)."""
    half_life_sec: float = 0.0
    """CORRAL_FAIR_SHARE_HALF_LIFE_SEC: how fast what a share held lately stops counting (0: it does not
    count; only what it holds now)."""

    @classmethod
    def parse(
        cls,
        fair_share: str,
        weights: str,
        max_running: str,
        group_of: Mapping[str, str] | None = None,
        half_life_sec: float = 0.0,
    ) -> ShareRules:
        """The rules from the settings' values; ValueError names the setting and the rule."""
        if fair_share not in ("on", "off"):
            raise ValueError(f"CORRAL_FAIR_SHARE must be on or off, got {fair_share!r}")
        if not (math.isfinite(half_life_sec) and half_life_sec >= 0):
            raise ValueError(f"CORRAL_FAIR_SHARE_HALF_LIFE_SEC must be >= 0 (0: off), got {half_life_sec}")
        if half_life_sec and fair_share != "on":
            raise ValueError("CORRAL_FAIR_SHARE_HALF_LIFE_SEC needs CORRAL_FAIR_SHARE=on (it weighs fair share)")
        try:
            parsed_weights = parse_weights(weights)
        except ValueError as exc:
            raise ValueError(f"CORRAL_OWNER_WEIGHTS: {exc}") from None
        try:
            cap, caps = parse_caps(max_running)
        except ValueError as exc:
            raise ValueError(f"CORRAL_OWNER_MAX_RUNNING: {exc}") from None
        return cls(fair_share == "on", parsed_weights, cap, caps, dict(group_of or {}), half_life_sec)

    @property
    def per_owner(self) -> bool:
        """Whether jobs must be queued per owner (fair share or a cap is on)."""
        return self.fair or self.max_running > 0 or any(self.max_running_for.values())

    def weight(self, share: str) -> float:
        """The weight of a share: a group's, or an owner's that is in none."""
        return self.weights.get(share, 1.0)

    def cap(self, owner: str) -> int:
        """The most jobs ``owner`` may have running (0: no cap)."""
        return self.max_running_for.get(owner, self.max_running)


def _rank(dominant: float, recent: float, weight: float) -> float:
    return (dominant + recent) / weight


def _dominant(threads: float, gpus: float, memory_mb: float, capacity: Capacity) -> float:
    """The largest part of ``capacity`` that these holdings are (threads alone with no worker connected:
    that still orders the shares)."""
    part = threads / max(1, capacity.threads)
    if capacity.gpus and gpus:
        part = max(part, gpus / capacity.gpus)
    if capacity.memory_mb and memory_mb:
        part = max(part, memory_mb / capacity.memory_mb)
    return part


FORGOTTEN = 1e-6
"""Average holdings (threads, GPUs or MiB) below which a share that holds nothing has no history left."""


class _Lately:
    """A share's average holdings over the recent past (see :meth:`OwnerUsage.recent_share`)."""

    __slots__ = ("at", "gpus", "memory_mb", "threads")

    def __init__(self, at: float) -> None:
        self.at = at
        self.threads = 0.0
        self.gpus = 0.0
        self.memory_mb = 0.0


@dataclass(frozen=True)
class ShareRow:
    """One share as ListShares shows it (see ``corral.v1.Share``)."""

    name: str
    owners: tuple[str, ...]
    weight: float
    running_jobs: int
    threads: int
    gpus: int
    memory_mb: int
    queued_jobs: int
    dominant_share: float
    recent_share: float
    rank: float
    thread_seconds: float
    gpu_seconds: float


class OwnerUsage:
    """Per owner: the jobs and threads its RUNNING jobs hold now, and the thread-seconds (and GPU-seconds)
    used so far; per share (a group, or an owner in none): the threads, GPUs and memory held now, and,
    with a half-life, held lately."""

    def __init__(
        self,
        group_of: Mapping[str, str] | None = None,
        half_life_sec: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``half_life_sec`` > 0 keeps each share's recent holdings (``clock``: seconds, steady)."""
        self._decay = math.log(2) / half_life_sec if half_life_sec > 0 else 0.0
        self._clock = clock
        self._lately: dict[str, _Lately] = {}
        self.running_jobs: Counter[str] = Counter()
        self.running_threads: Counter[str] = Counter()
        self.share_threads: Counter[str] = Counter()
        self.share_gpus: Counter[str] = Counter()
        self.share_memory_mb: Counter[str] = Counter()
        self.thread_seconds: defaultdict[str, float] = defaultdict(float)
        self.gpu_seconds: defaultdict[str, float] = defaultdict(float)
        self.used_before: dict[str, tuple[float, float]] = {}
        """Per owner, the thread- and GPU-seconds of earlier runs of the control plane (kept in the store)."""
        self.group_of: Mapping[str, str] = group_of or {}
        """CORRAL_GROUPS: owner -> group."""

    def share_of(self, owner: str) -> str:
        """Whose share ``owner``'s jobs count against: its group, else itself."""
        return self.group_of.get(owner, owner)

    def shares(self) -> set[str]:
        """The shares whose jobs hold anything now."""
        held = (self.share_threads, self.share_gpus, self.share_memory_mb)
        return {share for counter in held for share, n in counter.items() if n}

    def dominant_share(self, share: str, capacity: Capacity) -> float:
        """The largest part of ``capacity`` (threads, GPUs, memory) that the jobs of ``share`` hold.

        With no worker connected (nothing to take a part of), the number of threads held: that still
        orders the shares.
        """
        return _dominant(self.share_threads[share], self.share_gpus[share], self.share_memory_mb[share], capacity)

    def started(self, job: JobRecord) -> None:
        """``job`` became RUNNING (leased, or found running at start-up)."""
        self.running_jobs[job.owner] += 1
        self.running_threads[job.owner] += job.threads_granted
        self._hold(self.share_of(job.owner), job, 1)

    def stopped(self, job: JobRecord) -> None:
        """``job`` left RUNNING; its lease lasted from ``started_at`` to ``updated_at`` (the move)."""
        owner = job.owner
        self.running_jobs[owner] -= 1
        self.running_threads[owner] -= job.threads_granted
        self._hold(self.share_of(owner), job, -1)
        if job.started_at is not None:
            leased = max(0.0, job.updated_at - job.started_at)
            self.thread_seconds[owner] += leased * job.threads_granted
            if job.gpu_count:
                self.gpu_seconds[owner] += leased * job.gpu_count

    def recent_share(self, share: str, capacity: Capacity) -> float:
        """What ``share`` held lately: :meth:`dominant_share` of its holdings averaged over time, each
        moment weighed by 2^(-age / half-life) (an exponential moving average). A share that has held
        a part p for much longer than the half-life has p; one that just started, almost nothing.
        0 without a half-life."""
        if not self._decay:
            return 0.0
        lately = self._settled(share)
        return _dominant(lately.threads, lately.gpus, lately.memory_mb, capacity)

    def history(self) -> dict[str, tuple[float, float, float]]:
        """Each share's recent holdings now, (threads, GPUs, MiB of memory) on average, for keeping
        across a restart (none without a half-life). A share whose history has faded to nothing and
        that holds nothing is forgotten here, so that owners who came once do not pile up."""
        out: dict[str, tuple[float, float, float]] = {}
        for share in list(self._lately):
            lately = self._settled(share)
            holds = self.share_threads[share] or self.share_gpus[share] or self.share_memory_mb[share]
            if not holds and max(lately.threads, lately.gpus, lately.memory_mb) < FORGOTTEN:
                del self._lately[share]
                continue
            out[share] = (lately.threads, lately.gpus, lately.memory_mb)
        return out

    def restore(self, history: Mapping[str, tuple[float, float, float]], age_sec: float) -> None:
        """Take back :meth:`history` as it was ``age_sec`` ago: each share's has faded since, as if it
        had held nothing meanwhile. Nothing without a half-life."""
        if not self._decay:
            return
        kept = math.exp(-self._decay * max(0.0, age_sec))
        for share, (threads, gpus, memory_mb) in history.items():
            lately = self._settled(share)
            lately.threads += threads * kept
            lately.gpus += gpus * kept
            lately.memory_mb += memory_mb * kept

    def used(self, owner: str) -> tuple[float, float]:
        """``owner``'s thread- and GPU-seconds, this run's and the earlier runs' added."""
        before = self.used_before.get(owner, (0.0, 0.0))
        return self.thread_seconds.get(owner, 0.0) + before[0], self.gpu_seconds.get(owner, 0.0) + before[1]

    def rank(self, share: str, capacity: Capacity, weight: float) -> float:
        """What fair share orders shares by, lowest first: (what it holds now + what it held lately) /
        its weight."""
        return _rank(self.dominant_share(share, capacity), self.recent_share(share, capacity), weight)

    def rows(self, rules: ShareRules, capacity: Capacity, queued: Mapping[str, int]) -> list[ShareRow]:
        """Every share with jobs running or queued (``queued``: PENDING jobs per owner), usage or
        history, lowest rank first (the one fair share serves next), then by name."""
        owners = {o for counts in (self.running_jobs, self.thread_seconds, self.gpu_seconds, queued)
                  for o, n in counts.items() if n} | set(self.used_before)  # fmt: skip
        members: defaultdict[str, list[str]] = defaultdict(list)
        for owner in owners:
            members[self.share_of(owner)].append(owner)
        for share in self.shares() | self.remembered():  # history kept from before a restart, say
            members.setdefault(share, [])
        out = []
        for share, names in members.items():
            dominant = self.dominant_share(share, capacity)
            recent = self.recent_share(share, capacity)
            weight = rules.weight(share)
            out.append(
                ShareRow(
                    name=share,
                    owners=tuple(sorted(names)),
                    weight=weight,
                    running_jobs=sum(self.running_jobs[o] for o in names),
                    threads=self.share_threads[share],
                    gpus=self.share_gpus[share],
                    memory_mb=self.share_memory_mb[share],
                    queued_jobs=sum(queued.get(o, 0) for o in names),
                    dominant_share=dominant,
                    recent_share=recent,
                    rank=_rank(dominant, recent, weight),
                    thread_seconds=sum(self.used(o)[0] for o in names),
                    gpu_seconds=sum(self.used(o)[1] for o in names),
                )
            )
        out.sort(key=lambda row: (row.rank, row.name))
        return out

    def remembered(self) -> set[str]:
        """The shares whose history is kept (with a half-life: each that held or queued a job since the start)."""
        return set(self._lately)

    def _settled(self, share: str) -> _Lately:
        """``share``'s averages brought up to now: since their last change it has held what it holds."""
        now = self._clock()
        lately = self._lately.get(share)
        if lately is None:
            lately = self._lately[share] = _Lately(now)
            return lately
        elapsed = now - lately.at
        if elapsed > 0:
            kept = math.exp(-self._decay * elapsed)
            lately.threads = lately.threads * kept + self.share_threads[share] * (1 - kept)
            lately.gpus = lately.gpus * kept + self.share_gpus[share] * (1 - kept)
            lately.memory_mb = lately.memory_mb * kept + self.share_memory_mb[share] * (1 - kept)
            lately.at = now
        return lately

    def _hold(self, share: str, job: JobRecord, sign: int) -> None:
        if self._decay:
            self._settled(share)  # the time until now counts with what it held until now
        self.share_threads[share] += sign * job.threads_granted
        if job.gpu_count:
            self.share_gpus[share] += sign * job.gpu_count
        if job.memory_mb:
            self.share_memory_mb[share] += sign * job.memory_mb


class OwnerQueues:
    """PENDING jobs queued per owner; :meth:`pop` serves the owner furthest below its share of
    ``capacity`` (the connected workers').

    The same contract as :class:`control.queue.ReadyQueue` (push returns a token, entries are dropped
    lazily when ``is_live`` says a later push superseded them), plus ``looks_live``: the same test
    without consuming the entry, to look at each owner's next job before choosing one.
    """

    def __init__(
        self,
        is_live: Callable[[str, int], bool],
        looks_live: Callable[[str, int], bool],
        rules: ShareRules,
        usage: OwnerUsage,
        order: QueueOrder = STRICT,
        capacity: Callable[[], Capacity] = lambda: Capacity(0, 0, 0),
    ) -> None:
        self._heaps: dict[str, list[_Entry]] = {}
        self._order = order
        self._capacity = capacity
        self._is_live = is_live
        self._looks_live = looks_live
        self._rules = rules
        self._usage = usage
        self._token = 0
        self._size = 0

    def push(self, job_id: str, priority: int, ready_at: float, seq: int, owner: str = "") -> int:
        """Queue a job under its owner; returns the entry's token."""
        self._token += 1
        heap = self._heaps.get(owner)
        if heap is None:
            heap = self._heaps[owner] = []
        heapq.heappush(heap, (*self._order.rank(priority, ready_at, seq), job_id, self._token))
        self._size += 1
        return self._token

    def pop(self) -> str | None:
        """The next job of the owner furthest below its share and under its cap, or None."""
        rules, usage = self._rules, self._usage
        capacity = self._capacity() if rules.fair else None
        best: tuple[float, int, float, float, int] | None = None
        chosen = ""
        grouped = usage.group_of
        for owner in list(self._heaps):
            heap = self._heaps[owner]
            while heap and not self._looks_live(heap[0][3], heap[0][4]):
                heapq.heappop(heap)
                self._size -= 1
            if not heap:
                del self._heaps[owner]
                continue
            cap = rules.cap(owner)
            if cap and usage.running_jobs[owner] >= cap:
                continue
            if capacity is not None:
                group = usage.share_of(owner)
                share = usage.rank(group, capacity, rules.weight(group))
            else:
                share = 0.0
            rank, ready_at, seq, _, _ = heap[0]
            # Owners of one group share its rank: among them, the one holding fewer threads first, so that
            # one owner's high-priority jobs cannot keep another's out of the group's share for good.
            held = usage.running_threads[owner] if owner in grouped else 0
            key = (share, held, rank, ready_at, seq)
            if best is None or key < best:
                best, chosen = key, owner
        if best is None:
            return None
        heap = self._heaps[chosen]
        _, _, _, job_id, token = heapq.heappop(heap)
        self._size -= 1
        if not heap:
            del self._heaps[chosen]
        self._is_live(job_id, token)  # consume the entry (looks_live just said it is the live one)
        return job_id

    def __len__(self) -> int:
        """Entries, including superseded ones not dropped yet (an upper bound on live jobs)."""
        return self._size
