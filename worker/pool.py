"""RunnerPool: ``slots`` pre-started runner processes, each running one job at a time.

A job (:class:`JobSpec`) goes to an idle process at once or waits in a local FIFO. Each attempt
ends in exactly one :class:`Completion` handed to ``on_result`` (from inside the event loop, so the
caller can batch completions of one loop turn), except attempts killed with ``outcome=None``
("forget", for attempts the control plane rejected) and those still running at :meth:`stop`.

Killing (deadline, :meth:`kill`): SIGTERM, then SIGKILL after ``kill_grace_sec``, to the runner and its
process group; the completion is sent when the process is gone (seen through its pidfd), and a
replacement process is started so the pool keeps its size. Deadlines are event-loop timers
(``loop.call_at``), not polling; an attempt still waiting in the FIFO at its deadline (its runner
process still starting, after a crash) is reported HANDED_BACK there and then, never run: it goes back
in line with no attempt spent. The deadline counts from the assignment, as the control plane's lease
does, so the time an attempt waits for a process is taken from its run time. A process that dies by
itself reports its job FAILED with code ``CRASHED`` and is replaced the same way.

Strays: a process a job started that left its runner's process group (``setsid``, a daemon's double
fork) is not in the group a kill signals. The runner ends it as it exits by itself; when the runner is
killed or crashes instead, it comes to this process, which adopts orphans while a pool runs, and the
pool ends it (SIGKILL) and reaps it as soon as the runner is gone, before the attempt's completion is
sent (:mod:`worker.strays`).

Recycling: with ``max_jobs`` or ``max_rss_mb`` a runner process retires after that many jobs, or
after a job that left it that large (a plug-in that leaks); its last answer says so, the pool gives
it no other job and starts a replacement when it is gone, like after a job that left a child process
running. A retired process still there RETIRE_GRACE_SEC later (a non-daemon thread its job left keeps
it from exiting) is killed with its process group.

Memory: with ``memory_limit_mb`` (the agent gives its CORRAL_JOB_MEMORY_LIMIT_MB, checked with its
other settings; a pool built without one reads that variable as it starts) each runner process limits
its address space (see :mod:`runner.limits`). A job past the limit is reported FAILED with code
``MEMORY_LIMIT`` by its runner, which then exits; the pool never hands that process another job and
starts a replacement when it is gone.

GPUs: with ``gpus`` (the device ids of CORRAL_WORKER_GPUS) an attempt that holds ``g`` GPUs gets the
``g`` lowest-listed free devices as it starts, and its job sees only those: its runner sets
``CUDA_VISIBLE_DEVICES`` to them for the job (:mod:`runner.wire`); a job that holds none sees none (an
empty list). CUDA reads that variable once per process, so a runner that ran a job holding GPUs runs no
other: it exits after its answer and is replaced; and a GPU job runs only in a process that has run no
job yet (CUDA started there by an earlier job would keep that job's view, which has no device): an idle
process that did is replaced first, and the job waits the ~0.1 s its replacement takes to start. The attempt
keeps its devices until its process is gone, and its completion waits for that too: the control plane,
which counts the GPUs, never hands them to another job while the old process may still have them open. An attempt for which too few
devices are free (only a race can cause it: the control plane counts) does not run; it is reported
HANDED_BACK, which puts the job back in the queue without spending an attempt. A worker without GPUs
hands back attempts that ask for any and leaves ``CUDA_VISIBLE_DEVICES`` as the runners inherited it.

Printed output: with ``output_bytes`` the end of what a job prints comes with its completion
(``Completion.output``), and while it runs ``on_printed`` gets what it printed lately (see
:mod:`runner.output`), always before the attempt's completion; that of an attempt being killed is dropped.

The hot path (submit -> frame on a pipe -> frame back -> Completion) does no logging above debug,
no validation and no JSON parsing: payload and result stay the JSON text they arrived as.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.logs import GPUS_UNAVAILABLE, JOB_TIMED_OUT, RUNNER_RESTARTED
from runner.limits import memory_limit_from_env
from runner.procstate import LOST_PIPES_EXIT
from runner.wire import (
    FAILED,
    LAST,
    OK,
    OUTPUT,
    PLUGIN_IMPORT,
    PRINTED,
    READY,
    decode_printed,
    encode_request,
    split_output,
)
from worker import strays
from worker.attempt import Completion, JobSpec, Outcome
from worker.process import RunnerProcess, describe_exit
from worker.strays import StrayReaper

__all__ = ["PoolConfig", "RunnerPool", "RunnerStartError", "RunnerType"]

logger = logging.getLogger(__name__)

BACKSTOP_SEC = 1.0
"""How long past a job's deadline and the kill grace its runner process ends the job (with its process
group) by itself, should the worker not have stopped it: a worker that stands still (stopped, frozen,
its event loop blocked) kills nothing, while its control plane counts it lost after the heartbeat
timeout and runs the job again elsewhere. Later than the worker's own kill, which comes first when
the worker runs."""
RETIRE_GRACE_SEC = 5.0
"""How long a retired runner (after an answer flagged LAST, or renewed for a GPU job) has to exit before
it is killed with its process group: one that hangs as it exits (``sys.exit`` waits for any non-daemon
thread a job left) must not keep its slot for good, nor, after a job that held GPUs, that job's
completion and devices, which wait for its exit."""


@dataclass(frozen=True)
class PoolConfig:
    """What a RunnerPool needs; checked when built."""

    slots: int
    """Runner processes, = jobs run at once (>= 1)."""
    imports: tuple[str, ...] = ()
    """Plug-in modules each runner process imports once at start."""
    kill_grace_sec: float = 0.025
    """Seconds between SIGTERM and SIGKILL when a job is killed (>= 0)."""
    start_timeout_sec: float = 60.0
    """How long :meth:`RunnerPool.start` waits for every process to be ready (> 0)."""
    python: str = field(default=sys.executable)
    """The interpreter runner processes run on."""
    memory_limit_mb: int | None = None
    """MiB each job may allocate beyond an idle runner (0: no limit; None: ``CORRAL_JOB_MEMORY_LIMIT_MB``
    from the environment when the pool starts)."""
    max_jobs: int = 0
    """Jobs after which a runner process is replaced (0: never)."""
    max_rss_mb: int = 0
    """Resident MiB past which a runner process is replaced after its job (0: never)."""
    output_bytes: int = 0
    """How much of what each job prints comes back with its completion (0: nothing is caught)."""
    gpus: tuple[str, ...] = ()
    """GPU device ids handed to attempts that hold GPUs, the lowest-listed free ones first (empty: the
    worker has none)."""
    threads: int = 0
    """The most threads a job gets (the worker's): each runner process starts that many kernel threads
    before its memory limit, so that a job's threads do not count against it (0: one per CPU)."""

    def __post_init__(self) -> None:
        """Check the values."""
        if len(set(self.gpus)) != len(self.gpus) or any(not d or "," in d for d in self.gpus):
            raise ValueError(f"gpus must be distinct non-empty ids without ',', got {self.gpus}")
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if self.memory_limit_mb is not None and self.memory_limit_mb < 0:
            raise ValueError(f"memory_limit_mb must be >= 0, got {self.memory_limit_mb}")
        if self.max_jobs < 0 or self.max_rss_mb < 0:
            raise ValueError(f"max_jobs and max_rss_mb must be >= 0, got {self.max_jobs}, {self.max_rss_mb}")
        if self.kill_grace_sec < 0:
            raise ValueError(f"kill_grace_sec must be >= 0, got {self.kill_grace_sec}")
        if self.start_timeout_sec <= 0:
            raise ValueError(f"start_timeout_sec must be > 0, got {self.start_timeout_sec}")


class RunnerStartError(RuntimeError):
    """Raised when runner processes cannot be started (they crash or hang while starting, ...)."""


@dataclass(frozen=True, slots=True)
class RunnerType:
    """A job type the runner processes run, as their READY frame lists it (``runner.serve.catalog``)."""

    name: str
    schema_json: str
    description: str


@dataclass(slots=True, eq=False)
class _Running:
    spec: JobSpec
    proc: RunnerProcess
    started_at: float
    timer: asyncio.TimerHandle | None = None
    killing: bool = False
    kill_outcome: Outcome | None = None
    devices: tuple[str, ...] = ()
    """The GPUs it holds, until its process is gone."""
    answer: Completion | None = None
    """Its runner's answer, kept until the process is gone when the attempt held GPUs."""


_CRASH_BACKOFF_MAX_SEC = 5.0

# Error codes and messages of attempts the pool ends itself.
_KILL_CODES = {Outcome.TIMEOUT: "TIMEOUT", Outcome.CANCELLED: "CANCELLED", Outcome.HANDED_BACK: "HANDED_BACK"}


class RunnerPool:
    """A fixed number of runner processes and the jobs they run; see the module docstring."""

    def __init__(
        self,
        config: PoolConfig,
        on_result: Callable[[Completion], None],
        on_printed: Callable[[str, int, int, str], None] | None = None,
    ) -> None:
        """Create a stopped pool; :meth:`start` starts the processes. ``on_printed(job_id, attempt,
        offset, text)``: what a running attempt printed lately (with ``output_bytes``), always before
        that attempt's completion; nothing of an attempt being killed."""
        self.config = config
        self._on_result = on_result
        self._on_printed = on_printed
        self.may_start_queued: Callable[[], bool] = lambda: True
        """Whether an attempt that waited for a runner process may start now: not while the control plane
        may have counted this worker lost and given the attempt to another (worker.connection sets it);
        it stays queued, and :meth:`start_queued` takes the queue up again."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._strays: StrayReaper | None = None
        """Ends what a dead runner's jobs left outside its process group (from :meth:`start` to :meth:`stop`)."""
        self._procs: set[RunnerProcess] = set()
        self._idle: list[RunnerProcess] = []
        self._busy: dict[RunnerProcess, _Running] = {}
        self._running: dict[tuple[str, int], _Running] = {}
        self._queued: dict[tuple[str, int], JobSpec] = {}
        self._queue: deque[tuple[str, int]] = deque()
        self._queue_timers: dict[tuple[str, int], asyncio.TimerHandle] = {}
        """The deadline timer of each queued attempt that has a deadline."""
        self._retiring: dict[RunnerProcess, asyncio.TimerHandle] = {}
        """Retired processes not gone yet, and the timer that kills each if it does not exit in time."""
        self._idle_event = asyncio.Event()
        self._idle_event.set()
        self._all_exited = asyncio.Event()
        self._ready_event = asyncio.Event()
        self._started = False
        self._stopping = False
        self._crashes = 0
        self._start_failure = ""
        """Why a runner could not start, as it said (a plug-in that does not import)."""
        self._memory_limit_mb = 0
        self._gpus = config.gpus
        self._free_gpus = set(config.gpus)
        self.job_types: list[RunnerType] = []
        """The job types the runners run (from the first READY): what the worker registers."""
        self.restarts = 0
        """Replacement processes started so far (after kills, crashes and memory limits)."""

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start ``slots`` processes and wait until every one is ready.

        Raises:
            ImportError: a plug-in module does not import (the runner's own words, naming it).
            RunnerStartError: a process exited before it was ready, or they were not ready in time,
                or ``CORRAL_JOB_MEMORY_LIMIT_MB`` is malformed.
        """
        if self._started:
            return
        if self.config.memory_limit_mb is not None:
            self._memory_limit_mb = self.config.memory_limit_mb
        else:
            try:
                self._memory_limit_mb = memory_limit_from_env()
            except ValueError as exc:
                raise RunnerStartError(str(exc)) from None
        self._started = True
        self._loop = asyncio.get_running_loop()
        strays.adopt()  # before the first runner: what escapes a dead one then comes here, not to init
        self._strays = StrayReaper(self._loop)
        for _ in range(self.config.slots):
            self._spawn(replacement=False)  # start() itself waits start_timeout_sec for these
        deadline = self._loop.time() + self.config.start_timeout_sec
        while len(self._idle) < self.config.slots:
            if self._crashes:
                await self.stop()
                if self._start_failure:
                    raise ImportError(self._start_failure)
                raise RunnerStartError("a runner process exited while starting (does every --import module import?)")
            if self._loop.time() > deadline:
                await self.stop()
                raise RunnerStartError(f"runner processes not ready after {self.config.start_timeout_sec} s")
            self._ready_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready_event.wait(), timeout=max(0.0, deadline - self._loop.time()))

    async def stop(self, grace_sec: float = 5.0) -> None:
        """Stop every process (running jobs are killed without a completion). Idempotent."""
        if not self._started or self._stopping:
            if self._stopping and self._procs:
                await self._wait_all_exited(grace_sec)
            return
        self._stopping = True
        for running in list(self._running.values()):
            if running.timer is not None:
                running.timer.cancel()
        for timer in self._queue_timers.values():
            timer.cancel()
        self._queue_timers.clear()
        self._queued.clear()
        self._queue.clear()
        for proc in list(self._procs):
            proc.close_input()
            if proc in self._busy or not proc.ready:
                proc.signal(signal.SIGKILL)
        try:
            await self._wait_all_exited(grace_sec)
        finally:
            await self._stop_reaping(grace_sec)

    async def _stop_reaping(self, grace_sec: float) -> None:
        """End and reap the last strays (within ``grace_sec``), then stop adopting orphans for this pool."""
        reaper, self._strays = self._strays, None
        if reaper is None:
            return
        try:
            reaper.sweep()
            await reaper.settle(grace_sec)
        finally:
            reaper.close()
            strays.release()

    async def _wait_all_exited(self, grace_sec: float) -> None:
        if not self._procs:
            return
        self._all_exited.clear()
        try:
            await asyncio.wait_for(self._all_exited.wait(), grace_sec)
        except TimeoutError:
            for proc in list(self._procs):
                proc.signal(signal.SIGKILL)
            await asyncio.wait_for(self._all_exited.wait(), grace_sec)

    # -- jobs --------------------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> bool:
        """Run ``spec`` on an idle process, or queue it; False if that attempt is already here."""
        key = (spec.job_id, spec.attempt)
        if key in self._running or key in self._queued or self._stopping:
            return False
        self._idle_event.clear()
        if self._idle:
            proc = self._idle.pop() if not spec.gpus else self._idle_for_gpus()
            if self._needs_fresh(proc, spec):
                self._renew(proc)
                self._enqueue(spec, first=True)  # the replacement takes it first
            elif not self._start(proc, spec):
                self._idle.append(proc)
        else:
            self._enqueue(spec)
        return True

    def _enqueue(self, spec: JobSpec, first: bool = False) -> None:
        """Queue ``spec`` (at the head with ``first``) and arm its deadline: the process it waits for may
        take long to start, or never start (a plug-in that stopped importing), and the attempt must still
        end at its deadline, with a completion."""
        key = (spec.job_id, spec.attempt)
        self._queued[key] = spec
        if first:
            self._queue.appendleft(key)
        else:
            self._queue.append(key)
        loop = self._loop
        if spec.deadline is not None and loop is not None:  # no loop before start(): _start checks it then
            now = time.time()
            when = loop.time() + (spec.deadline - now)
            self._queue_timers[key] = loop.call_at(when, self._on_queued_deadline, key, now)

    def _unqueue(self, key: tuple[str, int]) -> JobSpec | None:
        """Take an attempt out of the waiting ones (its key may stay in ``_queue``, which skips it)."""
        timer = self._queue_timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        return self._queued.pop(key, None)

    def _on_queued_deadline(self, key: tuple[str, int], queued_at: float) -> None:
        self._queue_timers.pop(key, None)
        spec = self._queued.pop(key, None)
        if spec is None:
            return
        with contextlib.suppress(ValueError):
            self._queue.remove(key)
        logger.debug(JOB_TIMED_OUT, extra={"job_id": spec.job_id, "attempt": spec.attempt, "started": False})
        now = time.time()
        self._hand_back_unstarted(spec, now, f"it waited {round(now - queued_at, 3):g} s for a runner process")

    def _hand_back_unstarted(self, spec: JobSpec, now: float, waited: str) -> None:
        """Report an attempt whose deadline passed before it started HANDED_BACK: it never ran, through
        no fault of its own (its runner process was still starting, after a crash or a retirement), so
        it goes back in line with no attempt spent, rather than TIMEOUT, which spent one; but TIMEOUT while
        replacements die as they start (see there). Its deadline
        is not moved to when a process is ready instead: it counts from the assignment, as the control
        plane's lease does (which expires at that deadline plus a grace this worker does not know), and
        an attempt run past its lease could run twice."""
        if self._crashes:
            # Its replacements die as they start: this worker cannot run jobs now. Handed back, the job
            # would come back here (or another job would) and go round without end, unseen; TIMEOUT spends
            # an attempt, so that its retries and their end say what is wrong.
            message = f"deadline passed before start ({waited}; runner processes die as they start: "
            message += f"{self._crashes} in a row, see runner_restarted in the worker's log)"
            self._complete(spec, Outcome.TIMEOUT, now, now, "TIMEOUT", message)
        else:
            message = f"deadline passed before it started ({waited}); handed back, no attempt spent"
            self._complete(spec, Outcome.HANDED_BACK, now, now, "HANDED_BACK", message)
        self._check_idle()

    def _needs_fresh(self, proc: RunnerProcess, spec: JobSpec) -> bool:
        """Whether ``spec`` holds GPUs and ``proc`` already ran a job: CUDA, if that job started it there,
        keeps the devices that job saw (none), so the GPU job would find no device."""
        return bool(spec.gpus and self._gpus and not proc.fresh)

    def _renew(self, proc: RunnerProcess) -> None:
        """Retire an idle ``proc``: it exits, and its replacement (a fresh process) takes the queue's head."""
        self._retire(proc)

    def _retire(self, proc: RunnerProcess) -> None:
        """Have ``proc`` exit (:meth:`_on_exit` starts its replacement), and kill it with its process group
        if it is still there after RETIRE_GRACE_SEC: a thread its job left would otherwise keep it, and
        its slot, for good."""
        assert self._loop is not None
        proc.retired = True
        proc.close_input()
        self._retiring[proc] = self._loop.call_later(RETIRE_GRACE_SEC, proc.signal, signal.SIGKILL)

    def kill(self, job_id: str, attempt: int, outcome: Outcome | None) -> bool:
        """Stop one attempt and report it with ``outcome`` (None: report nothing); False if unknown."""
        key = (job_id, attempt)
        spec = self._unqueue(key)
        if spec is not None:
            if outcome is not None:
                now = time.time()
                self._complete(spec, outcome, now, now, _KILL_CODES[outcome], f"{outcome.value.lower()} before start")
            self._check_idle()
            return True
        running = self._running.get(key)
        if running is None:
            return False
        self._kill(running, outcome)
        return True

    def hand_back_queued(self) -> int:
        """Report every job still waiting for a process HANDED_BACK; returns how many."""
        keys = list(self._queued)
        for key in keys:
            self.kill(key[0], key[1], Outcome.HANDED_BACK)
        self._queue.clear()
        return len(keys)

    def kill_all(self, outcome: Outcome | None) -> int:
        """Kill every running (and queued) attempt with ``outcome``; returns how many."""
        keys = list(self._queued) + list(self._running)
        for key in keys:
            self.kill(key[0], key[1], outcome)
        return len(keys)

    def attempts(self) -> list[tuple[str, int, int]]:
        """(job_id, attempt, threads) of every attempt this pool holds: running, then queued."""
        out = [(r.spec.job_id, r.spec.attempt, r.spec.threads) for r in self._running.values()]
        out += [(s.job_id, s.attempt, s.threads) for s in self._queued.values()]
        return out

    def holds(self, job_id: str, attempt: int) -> bool:
        """Whether that attempt is running or queued here."""
        key = (job_id, attempt)
        return key in self._running or key in self._queued

    @property
    def busy(self) -> int:
        """Attempts running now."""
        return len(self._running)

    def started_since(self, when: float) -> bool:
        """Whether an attempt that started at or after ``when`` (``time.time()``) is still running."""
        return any(r.started_at >= when for r in self._running.values())

    @property
    def queued(self) -> int:
        """Attempts waiting for a process."""
        return len(self._queued)

    @property
    def idle(self) -> int:
        """Ready processes with nothing to do."""
        return len(self._idle)

    @property
    def free_gpus(self) -> tuple[str, ...]:
        """The device ids no attempt holds, in the order they are handed out."""
        return tuple(d for d in self._gpus if d in self._free_gpus)

    def pids(self) -> list[int]:
        """Pids of the live runner processes."""
        return sorted(p.pid for p in self._procs if not p.exited)

    async def wait_idle(self, within: float | None = None) -> bool:
        """Wait until no attempt is running or queued; False if ``within`` seconds passed first."""
        try:
            await asyncio.wait_for(self._idle_event.wait(), within)
        except TimeoutError:
            return False
        return True

    # -- internals ---------------------------------------------------------------------------------

    def _spawn(self, replacement: bool = True) -> None:
        assert self._loop is not None
        proc = RunnerProcess(self._loop, self._on_frame, self._on_exit)
        config = self.config
        proc.spawn(
            config.imports,
            config.python,
            self._memory_limit_mb,
            config.max_jobs,
            config.max_rss_mb,
            config.output_bytes,
            config.threads,
            config.kill_grace_sec + BACKSTOP_SEC,
        )
        self._procs.add(proc)
        if replacement:
            self._loop.call_later(config.start_timeout_sec, self._ready_or_killed, proc)

    def _ready_or_killed(self, proc: RunnerProcess) -> None:
        """A replacement not ready ``start_timeout_sec`` after it was started (a plug-in whose import hangs)
        is killed: it then counts as one that died as it started (attempts waiting for it end TIMEOUT,
        see :meth:`_hand_back_unstarted`) and is started again after the crash backoff, where it would
        otherwise hold its slot, and have the attempts given to it handed back, for ever."""
        if proc.ready or proc.exited or self._stopping:
            return
        logger.warning(
            RUNNER_RESTARTED,
            extra={"old_pid": proc.pid, "reason": f"not ready {self.config.start_timeout_sec:g} s after it started"},
        )
        proc.signal(signal.SIGKILL)

    def _start(self, proc: RunnerProcess, spec: JobSpec) -> bool:
        """Hand ``spec`` to ``proc``; False (and a completion) if its deadline already passed (TIMEOUT)
        or too few GPUs are free for it (HANDED_BACK)."""
        assert self._loop is not None
        now = time.time()
        deadline = spec.deadline
        if deadline is not None and deadline <= now:
            self._hand_back_unstarted(spec, now, "a runner process came free too late")
            return False
        devices: bytes | None = None  # None: the runner leaves CUDA_VISIBLE_DEVICES alone
        held: tuple[str, ...] = ()
        if self._gpus or spec.gpus:
            taken = self._take_gpus(spec.gpus)
            if taken is None:
                self._hand_back_for_gpus(spec, now)
                return False
            held = taken
            devices = ",".join(held).encode()
            proc.fresh = False
        running = _Running(spec, proc, now, devices=held)
        self._busy[proc] = running
        self._running[(spec.job_id, spec.attempt)] = running
        if deadline is not None:
            running.timer = self._loop.call_at(self._loop.time() + (deadline - now), self._on_deadline, running)
        proc.send(
            encode_request(
                spec.job_id.encode(),
                spec.type.encode(),
                spec.payload_json.encode(),
                spec.attempt,
                spec.threads,
                deadline or 0.0,
                devices,
            )
        )
        return True

    def _idle_for_gpus(self) -> RunnerProcess:
        """An idle process for a job holding GPUs: one that has run no job yet if there is one, else
        the one that became idle last (which :meth:`_needs_fresh` then has replaced)."""
        idle = self._idle
        for i in range(len(idle) - 1, -1, -1):
            if idle[i].fresh:
                return idle.pop(i)
        return idle.pop()

    def _take_gpus(self, count: int) -> tuple[str, ...] | None:
        """The ``count`` lowest-listed free devices, now held; None (nothing held) if too few are free."""
        if count > len(self._free_gpus):
            return None
        held = tuple(itertools.islice((d for d in self._gpus if d in self._free_gpus), count))
        self._free_gpus.difference_update(held)
        return held

    def _hand_back_for_gpus(self, spec: JobSpec, now: float) -> None:
        free = len(self._free_gpus)
        logger.warning(
            GPUS_UNAVAILABLE,
            extra={"job_id": spec.job_id, "attempt": spec.attempt, "gpus": spec.gpus, "free_gpus": free},
        )
        message = f"the job holds {spec.gpus} GPUs and {free} of this worker's {len(self._gpus)} are free"
        self._complete(spec, Outcome.HANDED_BACK, now, now, "HANDED_BACK", message)
        self._check_idle()

    def _on_frame(self, proc: RunnerProcess, kind: int, flags: int, code: bytes, body: bytes) -> None:
        running = self._busy.get(proc)
        if kind == PRINTED:  # live output: it must not touch the attempt's deadline timer nor its state
            if running is not None and not running.killing and self._on_printed is not None:
                offset, text = decode_printed(body)
                self._on_printed(running.spec.job_id, running.spec.attempt, offset, text)
            return
        if kind == READY:
            if not self.job_types and body:
                self.job_types = _catalog(body)
            proc.ready = True
            self._crashes = 0
            self._make_idle(proc)
            self._ready_event.set()
            return
        if not proc.ready and kind == FAILED and code.decode(errors="replace") == PLUGIN_IMPORT:
            self._start_failure = body.decode(errors="replace")  # it exits next: start() raises with this
            return
        if running is None or running.killing:
            return  # a late answer from a process being killed: its kill outcome is reported
        if running.timer is not None:
            running.timer.cancel()
        completion = _answer(running, kind, flags, code, body)
        if running.devices:
            self._retire_holding(running, completion)
            return
        del self._busy[proc]
        spec = running.spec
        del self._running[(spec.job_id, spec.attempt)]
        if flags & LAST:
            self._retire(proc)  # the runner exits after this answer
        else:
            self._make_idle(proc)
        if completion is not None:
            self._on_result(completion)
        self._check_idle()

    def _retire_holding(self, running: _Running, answer: Completion | None) -> None:
        """Retire the process of an attempt that held GPUs, which answered: the attempt, its devices
        and its answer stay until the process is gone (:meth:`_on_exit`), within RETIRE_GRACE_SEC."""
        running.answer = answer
        self._retire(running.proc)  # it already exits after such an answer (flagged LAST); this makes sure

    def start_queued(self) -> None:
        """Start what waits for a runner process on the idle ones, now that :attr:`may_start_queued` allows."""
        while self._queue and self._idle and self.may_start_queued():
            self._make_idle(self._idle.pop())

    def _make_idle(self, proc: RunnerProcess) -> None:
        if self._queue and not self._stopping and not self.may_start_queued():
            self._idle.append(proc)  # held back: see may_start_queued
            return
        while self._queue:
            key = self._queue[0]
            spec = self._queued.get(key)
            if spec is not None and self._needs_fresh(proc, spec):
                self._renew(proc)
                return
            self._queue.popleft()
            self._unqueue(key)
            if spec is not None and self._start(proc, spec):
                return
        if not self._stopping:
            self._idle.append(proc)

    def _on_deadline(self, running: _Running) -> None:
        running.timer = None
        if running.killing:
            return
        spec = running.spec
        logger.debug(JOB_TIMED_OUT, extra={"job_id": spec.job_id, "attempt": spec.attempt, "pid": running.proc.pid})
        self._kill(running, Outcome.TIMEOUT)

    def _kill(self, running: _Running, outcome: Outcome | None) -> None:
        assert self._loop is not None
        if running.killing:
            return
        running.killing = True
        running.kill_outcome = outcome
        if running.timer is not None:
            running.timer.cancel()
        running.proc.signal(signal.SIGTERM)
        if self.config.kill_grace_sec > 0:
            running.timer = self._loop.call_later(self.config.kill_grace_sec, running.proc.signal, signal.SIGKILL)
        else:
            running.proc.signal(signal.SIGKILL)

    def _on_exit(self, proc: RunnerProcess) -> None:
        if self._strays is not None:  # first: they get their SIGKILL before the attempt is reported ended
            self._strays.sweep()
        self._procs.discard(proc)
        retiring = self._retiring.pop(proc, None)
        if retiring is not None:
            retiring.cancel()
        if proc in self._idle:
            self._idle.remove(proc)
        running = self._busy.pop(proc, None)
        if running is not None:
            spec = running.spec
            del self._running[(spec.job_id, spec.attempt)]
            if running.timer is not None:
                running.timer.cancel()
            if running.devices:  # freed before the completion goes out, so a next job finds them free
                self._free_gpus.update(running.devices)
            now = time.time()
            if running.answer is not None:
                if not running.killing or running.kill_outcome is not None:  # not forgotten meanwhile
                    self._on_result(running.answer)
            elif running.killing:
                outcome = running.kill_outcome
                if outcome is not None:
                    message = f"killed ({describe_exit(proc.returncode)})"
                    if outcome is Outcome.TIMEOUT and spec.deadline is not None:
                        ran = spec.deadline - running.started_at
                        message = f"{_timeout_passed(spec.timeout_sec, ran)}; {_ended_by_backstop(spec, proc, now) or message}"
                    self._complete(spec, outcome, running.started_at, now, _KILL_CODES[outcome], message)
            elif spec.deadline is not None and (backstop := _ended_by_backstop(spec, proc, now)):
                message = f"{_timeout_passed(spec.timeout_sec, spec.deadline - running.started_at)}; {backstop}"
                self._complete(spec, Outcome.TIMEOUT, running.started_at, now, "TIMEOUT", message)
            elif not self._stopping:
                self._complete(spec, Outcome.FAILED, running.started_at, now, "CRASHED", _crash_message(proc))
            self._check_idle()
        if not proc.ready:
            self._crashes += 1
            self._ready_event.set()  # wakes start(), which fails
        if self._stopping:
            if not self._procs:
                self._all_exited.set()
            return
        self._replace(proc, running)

    def _replace(self, old: RunnerProcess, running: _Running | None) -> None:
        assert self._loop is not None
        self.restarts += 1
        if running is not None and running.killing:
            reason = "killed"
        elif old.retired and old.returncode == 0:
            reason = "retired after its last job (MEMORY_LIMIT, a process the job left running, a job that "
            reason += "held GPUs, CORRAL_RUNNER_MAX_JOBS or CORRAL_RUNNER_MAX_RSS_MB)"
        elif old.retired:
            reason = f"retired after its last job, then {describe_exit(old.returncode)} (one still there "
            reason += f"{RETIRE_GRACE_SEC:g} s later, which a thread its job left can cause, is killed)"
        else:
            reason = describe_exit(old.returncode)
        delay = 0.0 if not self._crashes else min(_CRASH_BACKOFF_MAX_SEC, 0.05 * 2 ** (self._crashes - 1))
        logger.info(RUNNER_RESTARTED, extra={"old_pid": old.pid, "reason": reason, "delay_sec": delay})
        if delay:
            self._loop.call_later(delay, self._respawn)
        else:
            self._respawn()

    def _respawn(self) -> None:
        if self._stopping:
            return
        try:
            self._spawn()
        except OSError:
            logger.exception(RUNNER_RESTARTED, extra={"error": "spawn failed"})
            assert self._loop is not None
            self._crashes += 1
            self._loop.call_later(min(_CRASH_BACKOFF_MAX_SEC, 0.05 * 2**self._crashes), self._respawn)

    def _complete(
        self, spec: JobSpec, outcome: Outcome, started: float, finished: float, code: str, message: str
    ) -> None:
        self._on_result(Completion(spec.job_id, spec.attempt, outcome, "", code, message, started, finished))

    def _check_idle(self) -> None:
        if not self._running and not self._queued:
            self._idle_event.set()


def _ended_by_backstop(spec: JobSpec, proc: RunnerProcess, now: float) -> str:
    """What to say of an attempt whose runner process most likely ended it by itself, BACKSTOP_SEC past its
    deadline (killed, and this worker came to it later than that: it stood still); "" otherwise."""
    if spec.deadline is None or proc.returncode != -signal.SIGKILL or now < spec.deadline + BACKSTOP_SEC:
        return ""
    return (
        f"its runner process ended it about {BACKSTOP_SEC:g} s past its deadline, the worker having stood still "
        f"(it came to it {now - spec.deadline:.1f} s late)"
    )


def _crash_message(proc: RunnerProcess) -> str:
    """What a CRASHED attempt says of how its runner process ended."""
    if proc.garbled:
        return (
            f"runner process {proc.pid} killed: {proc.garbled} (the job wrote to the runner's pipe to the "
            "worker; its answer cannot be told from that)"
        )
    if proc.returncode == LOST_PIPES_EXIT:
        return (
            f"runner process {proc.pid} exited ({describe_exit(proc.returncode)}): the job closed or replaced "
            "its pipes to the worker, so its answer could not be sent"
        )
    return f"runner process {proc.pid} died ({describe_exit(proc.returncode)})"


def _timeout_passed(timeout_sec: float, ran_sec: float) -> str:
    """What a TIMEOUT says of an attempt killed at its deadline: the job's own timeout, and how long it
    ran, which is less when it waited for a runner process (the deadline counts from its assignment)."""
    ran = f"ran {round(ran_sec, 3):g} s"
    if timeout_sec > 0:
        return f"timeout of {timeout_sec:g} s passed ({ran})"
    return f"deadline passed ({ran})"  # a spec made without its timeout (not from an assignment)


def _answer(running: _Running, kind: int, flags: int, code: bytes, body: bytes) -> Completion | None:
    """The completion a runner's OK or FAILED answer makes (None for another kind)."""
    spec = running.spec
    now = time.time()
    output = ""
    if flags & OUTPUT:
        printed, body = split_output(flags, body)
        output = printed.decode("utf-8", "replace")
    if kind == OK:
        return Completion(
            spec.job_id, spec.attempt, Outcome.SUCCEEDED, body.decode(), "", "", running.started_at, now, output
        )
    if kind == FAILED:
        return Completion(
            spec.job_id,
            spec.attempt,
            Outcome.FAILED,
            "",
            code.decode(),
            body.decode("utf-8", "replace"),
            running.started_at,
            now,
            output,
        )
    return None


def _catalog(body: bytes) -> list[RunnerType]:
    """The job types of a READY frame's body (see ``runner.serve.catalog``)."""
    return [RunnerType(t["name"], json.dumps(t["schema"]), t.get("description", "")) for t in json.loads(body)]
