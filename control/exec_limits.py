"""Execution rate limits: how fast jobs of a type, or of a ``rate_key`` label, may start.

``CORRAL_EXEC_RATE_LIMITS`` is a comma-separated list of rules ``scope:name=rate/unit[:burst]``::

    type:webhook=10/s,key:api.example.com=5/s:10,type:email=100/m

``type:NAME`` limits jobs of that type; ``key:NAME`` limits jobs whose ``rate_key`` label is NAME,
whatever their type (e.g. every job that calls one host). The unit is ``s``, ``m`` or ``h``. The
burst (default 1: starts evenly spaced) is how many may start at once after a quiet spell. A job
matched by a type rule and a key rule waits for both.

The control plane enforces the limits at dispatch, across all workers: each rule is a
:class:`Gate` (a token bucket and the jobs it holds back). A job whose gate has no token is taken
out of the ready queue and *parked* in the gate, ordered as the ready queue orders jobs; it keeps
its state (PENDING) and spends no attempt. So the dispatcher never looks at it again until the gate
releases it, and the jobs behind it (other keys, no key) keep flowing. When the gate's next token
is due, a timer on the event loop releases the best parked jobs back to the ready queue, as many as
there are tokens, and the token is taken when a job actually starts. A job that ranks below jobs
already parked in its gate parks behind them, so a gate starts its jobs in queue order.

Limits live in memory: after a restart every bucket starts full.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from control.admission.ratelimit import EPSILON, TokenBucket
from control.clock import Clock
from control.queue import Rank

RATE_KEY_LABEL = "rate_key"
"""The job label that names the rate key a ``key:`` rule limits."""

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
"""Unit -> seconds."""

SCOPES = ("type", "key")

EXAMPLE = "type:webhook=10/s or key:api.example.com=5/s:10"


@dataclass(frozen=True, slots=True)
class ExecRule:
    """One rule: at most ``per_second`` starts a second of ``scope:name``, ``burst`` at once."""

    scope: str
    """``type`` (a job type) or ``key`` (the ``rate_key`` label)."""
    name: str
    per_second: float
    burst: int = 1
    text: str = ""
    """The rule as written (``type:webhook=10/s``), for messages and stats."""

    @property
    def target(self) -> str:
        """``scope:name``: what the rule limits (the metric label)."""
        return f"{self.scope}:{self.name}"


def parse_exec_limits(spec: str) -> tuple[ExecRule, ...]:
    """Parse ``CORRAL_EXEC_RATE_LIMITS``; raises ValueError naming the rule and what is wrong."""
    rules: list[ExecRule] = []
    seen: set[str] = set()
    for raw in spec.split(","):
        text = raw.strip()
        if not text:
            continue
        rule = _parse_rule(text)
        if rule.target in seen:
            raise ValueError(f"rule {text!r}: {rule.target} is limited twice")
        seen.add(rule.target)
        rules.append(rule)
    return tuple(rules)


def _parse_rule(text: str) -> ExecRule:
    def bad(why: str) -> ValueError:
        return ValueError(f"rule {text!r}: {why} (rules look like {EXAMPLE})")

    target, eq, limit = text.rpartition("=")
    if not eq:
        raise bad("missing '=rate/unit'")
    scope, colon, name = target.strip().partition(":")
    scope, name = scope.strip(), name.strip()
    if not colon or scope not in SCOPES:
        raise bad("must start with type: or key:")
    if not name:
        raise bad(f"the {scope} name is empty")
    rate_text, slash, rest = limit.strip().partition("/")
    unit, colon, burst_text = rest.partition(":")
    unit = unit.strip()
    if not slash or unit not in UNITS:
        raise bad(f"the unit must be /s, /m or /h, got {limit.strip()!r}")
    try:
        count = float(rate_text)
    except ValueError:
        raise bad(f"the rate must be a number, got {rate_text.strip()!r}") from None
    if not (math.isfinite(count) and count > 0):
        raise bad(f"the rate must be > 0, got {rate_text.strip()!r}")
    burst = 1
    if colon:
        try:
            burst = int(burst_text)
        except ValueError:
            raise bad(f"the burst must be an integer, got {burst_text.strip()!r}") from None
        if burst < 1:
            raise bad(f"the burst must be >= 1, got {burst}")
    return ExecRule(scope, name, count / UNITS[unit], burst, text)


class Gate:
    """One rule's token bucket and the jobs it holds back (a heap in ready-queue order)."""

    __slots__ = ("bucket", "heap", "rule", "timer", "waiting")

    def __init__(self, rule: ExecRule, now: float) -> None:
        self.rule = rule
        self.bucket = TokenBucket(rule.per_second, rule.burst, now)
        self.heap: list[tuple[float, float, int, str]] = []
        self.waiting = 0
        """Jobs parked here now (cancelled ones leave at once; their heap entries lazily)."""
        self.timer: asyncio.TimerHandle | None = None
        """The pending wake-up while jobs are parked here."""


NO_GATES: tuple[Gate, ...] = ()


class ExecLimits:
    """The gates of every rule, and which jobs they hold.

    The scheduler asks :meth:`gates_for` for each job it pops; a job with gates goes through
    :meth:`blocker` (:meth:`hold` it when a gate says no) and, once placed on a worker, :meth:`take`.
    A timer (on the running event loop) calls :meth:`release` when a gate's next token is due and
    hands the released job ids to ``on_release`` (the scheduler queues them again).

    Args:
        rules: the parsed ``CORRAL_EXEC_RATE_LIMITS``.
        clock: where "now" comes from.
        on_release: called with job ids a gate lets go (they are still PENDING unless cancelled).
        on_delayed: called with a rule's target each time a job is first held back by it.
    """

    def __init__(
        self,
        rules: tuple[ExecRule, ...],
        clock: Clock,
        on_release: Callable[[list[str]], None] = lambda ids: None,
        on_delayed: Callable[[str], None] = lambda target: None,
    ) -> None:
        self.clock = clock
        self.on_release = on_release
        self.on_delayed = on_delayed
        now = clock.now()
        self.gates = [Gate(r, now) for r in rules]
        self._by_type = {g.rule.name: g for g in self.gates if g.rule.scope == "type"}
        self._by_key = {g.rule.name: g for g in self.gates if g.rule.scope == "key"}
        self._parked: dict[str, Gate] = {}
        """Job id -> the gate holding it."""
        self._held: set[str] = set()
        """Jobs held back since they last became ready and not started yet (each counted delayed once)."""

    def __bool__(self) -> bool:
        return bool(self.gates)

    def gates_for(self, job_type: str, labels: dict[str, str]) -> tuple[Gate, ...]:
        """The gates a job must pass: its type's rule and its ``rate_key``'s rule, if any."""
        by_type = self._by_type.get(job_type)
        key = labels.get(RATE_KEY_LABEL) if self._by_key else None
        by_key = self._by_key.get(key) if key else None
        if by_type is None:
            return NO_GATES if by_key is None else (by_key,)
        return (by_type,) if by_key is None else (by_type, by_key)

    def blocker(self, gates: tuple[Gate, ...], order: Rank, now: float) -> Gate | None:
        """The gate that holds this job back now, or None when it may start.

        A gate holds a job back when it has no token, or when better-ranked jobs are parked in it
        (they go first). With several such gates, the one whose token comes last."""
        worst: Gate | None = None
        worst_wait = 0.0
        for gate in gates:
            head = self._head(gate)
            if head is not None and head < order:
                return gate
            wait = gate.bucket.wait(1, now)
            if wait > worst_wait:
                worst, worst_wait = gate, wait
        return worst

    def park(self, gate: Gate, order: Rank, job_id: str) -> bool:
        """Hold the job in ``gate``; True the first time it is held back since it became ready."""
        heapq.heappush(gate.heap, (*order, job_id))
        self._parked[job_id] = gate
        gate.waiting += 1
        if job_id in self._held:
            return False
        self._held.add(job_id)
        return True

    def hold(self, gate: Gate, order: Rank, job_id: str, now: float) -> None:
        """Park the job in ``gate`` and make sure a wake-up is due for the gate's next token."""
        if self.park(gate, order, job_id):
            self.on_delayed(gate.rule.target)
        if gate.timer is None:
            self._arm(gate, gate.bucket.wait(1, now))

    def _arm(self, gate: Gate, delay: float) -> None:
        gate.timer = asyncio.get_running_loop().call_later(delay, self._wake, gate)

    def _wake(self, gate: Gate) -> None:
        gate.timer = None
        released, again = self.release(gate, self.clock.now())
        if again is not None:
            self._arm(gate, again)
        if released:
            self.on_release(released)

    def close(self) -> None:
        """Cancel the pending wake-ups (the scheduler is going away)."""
        for gate in self.gates:
            if gate.timer is not None:
                gate.timer.cancel()
                gate.timer = None

    def take(self, gates: tuple[Gate, ...], job_id: str, now: float) -> None:
        """The job starts: one token from each of its gates (:meth:`blocker` said they have one)."""
        for gate in gates:
            gate.bucket.take(1, now)
        self._held.discard(job_id)

    def release(self, gate: Gate, now: float) -> tuple[list[str], float | None]:
        """Let the best parked jobs go back to the ready queue, one per whole token the gate has.
        Returns their ids and, while jobs remain parked, the seconds until the gate's next token
        after those (when the scheduler should call again), else None."""
        tokens = gate.bucket.available(now)
        if tokens + EPSILON < 1:  # woken before the token (the last one was taken after the release)
            return [], (None if self._head(gate) is None else (1 - tokens) / gate.bucket.rate)
        n = math.floor(tokens + EPSILON)
        out: list[str] = []
        heap = gate.heap
        while heap and len(out) < n:
            job_id = heapq.heappop(heap)[3]
            if self._parked.get(job_id) is gate:
                del self._parked[job_id]
                gate.waiting -= 1
                out.append(job_id)
        if self._head(gate) is None:
            return out, None
        return out, max(EPSILON, (len(out) + 1 - tokens) / gate.bucket.rate)

    def discard(self, job_id: str) -> None:
        """The job left the queue without starting (cancelled): forget it."""
        self._held.discard(job_id)
        gate = self._parked.pop(job_id, None)
        if gate is not None:
            gate.waiting -= 1

    def _head(self, gate: Gate) -> Rank | None:
        """The best job parked in ``gate`` (dropping entries of jobs no longer parked there)."""
        heap = gate.heap
        while heap:
            prio, ready_at, seq, job_id = heap[0]
            if self._parked.get(job_id) is gate:
                return (prio, ready_at, seq)
            heapq.heappop(heap)
        return None

    def held(self) -> int:
        """Jobs held back by a limit and not started yet (parked, or released and not yet placed)."""
        return len(self._held)

    def parked(self) -> int:
        """Jobs a gate holds now (waiting for a token); those it released wait like any ready job."""
        return len(self._parked)

    def is_parked(self, job_id: str) -> bool:
        """Whether a gate holds the job now (see :meth:`parked`)."""
        return job_id in self._parked
