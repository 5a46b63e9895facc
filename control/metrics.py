"""Every Prometheus metric of the control plane, defined once.

Two kinds, chosen so that the hot path (about 150 µs per job) pays next to nothing:

* State, read when Prometheus scrapes (:class:`StateCollector`): nothing is updated as jobs move.
  ``corral_queue_depth{queue="ready"|"scheduled"}``, ``corral_jobs{state}``,
  ``corral_dead_letter_jobs``, ``corral_workers{state}``, ``corral_worker_heartbeat_age_max_seconds``
  (the oldest heartbeat), ``corral_ready``, ``corral_watched_jobs`` (jobs followed by open streams,
  one per job per stream), and per owner (control.shares)
  ``corral_owner_thread_seconds_total{owner,group}``, ``corral_owner_gpu_seconds_total{owner,group}``,
  ``corral_owner_running_jobs{owner,group}`` and, per share (a group, or an owner in none),
  ``corral_share_dominant{share}`` (and ``corral_share_recent{share}`` with a fair-share half-life); the connected workers' ``corral_gpus{state}`` and
  ``corral_memory_mb{state}`` (held or free).
* Events, bumped where they happen (:class:`Metrics`; a cached labelled child costs about 1 µs):
  ``corral_jobs_submitted_total{type}``, ``corral_jobs_succeeded_total{type}``,
  ``corral_jobs_failed_total{type,reason}`` (dead-lettered), ``corral_job_attempt_failures_total{type,reason}``
  (every failed attempt), ``corral_job_retries_total{reason}`` (``reason`` is the error code; past
  MAX_REASONS distinct ones, ``OTHER``), ``corral_jobs_cancelled_total{type}``,
  ``corral_jobs_redriven_total{type}`` (FAILED jobs re-driven by RetryJob or RetryJobs), ``corral_lease_timeouts_total``,
  ``corral_idempotent_replays_total``, ``corral_rate_limited_requests_total`` (submissions refused by
  a submission rate limit), ``corral_exec_rate_delayed_jobs_total{limit}`` (jobs held back by an
  execution rate limit; ``corral_exec_rate_waiting_jobs{limit}`` is how many wait now),
  ``corral_http_requests_total{route,code}``, and the histograms ``corral_dispatch_latency_seconds``
  (ready -> leased) and ``corral_job_run_seconds{type}`` (successful attempts, as the worker measured them).
* The autoscaler (set by ``control.autoscale``): ``corral_autoscaler_decisions_total{action,reason}``
  (every evaluation, ``action`` = up | down | none), ``corral_autoscaler_workers{state}`` (current,
  desired, starting, draining), ``corral_autoscaler_errors_total{kind}`` and
  ``corral_autoscaler_containers_replaced_total``.

Each control plane has its own :class:`~prometheus_client.CollectorRegistry` (``Metrics.registry``),
so two of them in one process (tests) never mix, and nothing lands in prometheus_client's global one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control.clock import Clock
from control.exec_limits import ExecLimits
from control.jobs import CANCELLED, ERROR, LEASE_EXPIRED, TIMEOUT, WORKER_LOST, JobState
from control.registry import WorkerRegistry, WorkerState
from control.shares import OwnerUsage
from control.watch import Watchers

DISPATCH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Seconds from a job becoming ready to its lease."""
RUN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
"""Seconds one successful attempt ran on its worker."""
MAX_REASONS = 64
"""Distinct failure reasons (error codes) labelled at most; later ones are counted as ``OTHER_REASON``.
A job type's code is its author's choice, and one that puts a changing value in it (an id, a message)
would otherwise make a new time series for every failure, without end."""
OTHER_REASON = "OTHER"
_OWN_REASONS = frozenset({ERROR, TIMEOUT, WORKER_LOST, LEASE_EXPIRED, CANCELLED})
"""Reasons the control plane and the worker give themselves: always labelled, never counted in MAX_REASONS."""


class Metrics:
    """The event counters and histograms of one control plane, and the registry that holds them."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self.submitted = Counter(
            "corral_jobs_submitted", "Jobs accepted (idempotent replays excluded).", ["type"], registry=r
        )
        self.succeeded = Counter("corral_jobs_succeeded", "Jobs that ended SUCCEEDED.", ["type"], registry=r)
        self.failed = Counter(
            "corral_jobs_failed", "Jobs that ended FAILED (into the dead-letter queue).", ["type", "reason"], registry=r
        )
        self.attempt_failures = Counter(
            "corral_job_attempt_failures", "Failed attempts, retried or not.", ["type", "reason"], registry=r
        )
        self.retries = Counter(
            "corral_job_retries", "Retries scheduled after a failed attempt.", ["reason"], registry=r
        )
        self.cancelled = Counter(
            "corral_jobs_cancelled",
            "Jobs that ended CANCELLED: by CancelJob or CancelJobs, or by a job they waited on (DEPENDENCY_FAILED).",
            ["type"],
            registry=r,
        )
        self.redriven = Counter(
            "corral_jobs_redriven",
            "FAILED jobs re-driven out of the dead-letter queue by RetryJob or RetryJobs.",
            ["type"],
            registry=r,
        )
        self.lease_timeouts = Counter(
            "corral_lease_timeouts",
            "Leases that expired (deadline + grace) on a worker that did not report.",
            registry=r,
        )
        self.jobs_purged = Counter(
            "corral_jobs_purged",
            "Finished jobs deleted from the store past their retention (CORRAL_JOB_RETENTION_SEC, CORRAL_FAILED_RETENTION_SEC).",
            ["state"],
            registry=r,
        )
        self.idempotent_replays = Counter(
            "corral_idempotent_replays",
            "Submissions answered with the job an idempotency key already made.",
            registry=r,
        )
        self.logins = Counter(
            "corral_logins",
            "Logins to accounts (CORRAL_ACCOUNTS), by outcome: ok, refused (wrong name or password), throttled.",
            ["outcome"],
            registry=r,
        )
        for outcome in ("ok", "refused", "throttled"):  # at 0 from the start, so that rate() sees the first one
            self.logins.labels(outcome)
        self.auth_refused = Counter(
            "corral_auth_refused",
            "Calls refused UNAUTHENTICATED (gRPC) or 401 (REST) for a missing or wrong token, by the role they needed.",
            ["role"],
            registry=r,
        )
        self.auth_token_reloads = Counter(
            "corral_auth_token_reloads",
            "Reloads of CORRAL_AUTH_TOKEN_FILE (on change or SIGHUP), by result: ok, or error (old tokens kept).",
            ["result"],
            registry=r,
        )
        self.rate_limited = Counter(
            "corral_rate_limited_requests", "Requests refused with RESOURCE_EXHAUSTED by a rate limit.", registry=r
        )
        self.http_requests = Counter(
            "corral_http_requests", "HTTP requests by route and status.", ["route", "code"], registry=r
        )
        self.dispatch_latency = Histogram(
            "corral_dispatch_latency_seconds", "From ready to leased.", buckets=DISPATCH_BUCKETS, registry=r
        )
        self.run_seconds = Histogram(
            "corral_job_run_seconds", "Run time of successful attempts.", ["type"], buckets=RUN_BUCKETS, registry=r
        )
        self.autoscaler_decisions = Counter(
            "corral_autoscaler_decisions",
            "Autoscaler evaluations by outcome (action up|down|none) and reason.",
            ["action", "reason"],
            registry=r,
        )
        self.autoscaler_workers = Gauge(
            "corral_autoscaler_workers",
            "Autoscaled workers: current, desired, starting (not yet registered), draining.",
            ["state"],
            registry=r,
        )
        self.autoscaler_errors = Counter(
            "corral_autoscaler_errors",
            "Autoscaler failures (Docker unreachable, image missing, ...).",
            ["kind"],
            registry=r,
        )
        self.autoscaler_replaced = Counter(
            "corral_autoscaler_containers_replaced",
            "Worker containers that exited unexpectedly and were replaced.",
            registry=r,
        )
        self.exec_rate_delayed = Counter(
            "corral_exec_rate_delayed_jobs",
            "Jobs held in the queue by an execution rate limit (once per wait), by rule target.",
            ["limit"],
            registry=r,
        )
        self.active = Gauge(
            "corral_control_plane_active",
            "1 while this control plane leads its store, 0 while it stands by (another one leads it).",
            registry=r,
        )
        self._by_type: dict[tuple[str, str], Callable[..., None]] = {}
        self._reasons: set[str] = set()  # labelled failure reasons other than the control plane's own

    # ---- hooks (hot path: cached children, no formatting) -------------------------------------------
    def job_submitted(self, job_type: str, n: int = 1) -> None:
        """``n`` fresh jobs of ``job_type`` were accepted."""
        inc = self._by_type.get(("submitted", job_type))
        if inc is None:
            inc = self._by_type[("submitted", job_type)] = self.submitted.labels(job_type).inc
        inc(n)

    def job_succeeded(self, job_type: str, run_seconds: float) -> None:
        """One job ended SUCCEEDED after running ``run_seconds``."""
        inc = self._by_type.get(("succeeded", job_type))
        if inc is None:
            inc = self._by_type[("succeeded", job_type)] = self.succeeded.labels(job_type).inc
            self._by_type[("run", job_type)] = self.run_seconds.labels(job_type).observe
        inc()
        self._by_type[("run", job_type)](run_seconds)

    def attempt_failed(self, job_type: str, reason: str, retry: bool) -> None:
        """One attempt failed with ``reason``; ``retry`` tells whether the job will run again."""
        if reason == LEASE_EXPIRED:
            self.lease_timeouts.inc()
        if reason not in self._reasons and reason not in _OWN_REASONS:
            if len(self._reasons) >= MAX_REASONS:
                reason = OTHER_REASON
            else:
                self._reasons.add(reason)
        self.attempt_failures.labels(job_type, reason).inc()
        if retry:
            self.retries.labels(reason).inc()
        else:
            self.failed.labels(job_type, reason).inc()

    def job_cancelled(self, job_type: str) -> None:
        """One job ended CANCELLED."""
        self.cancelled.labels(job_type).inc()

    def job_redriven(self, job_type: str) -> None:
        """One FAILED job was re-driven."""
        self.redriven.labels(job_type).inc()

    def watch(self, scheduler: SchedulerView, ready: Callable[[], bool]) -> None:
        """Expose the scheduler's state at scrape time."""
        self.registry.register(StateCollector(scheduler, ready))

    def watch_exec_limits(self, limits: ExecLimits) -> None:
        """Expose ``corral_exec_rate_waiting_jobs{limit}``: jobs each execution limit holds now."""
        self.registry.register(ExecLimitsCollector(limits))


class SchedulerView(Protocol):
    """What :class:`StateCollector` reads (``control.scheduler.Scheduler`` has it)."""

    @property
    def registry(self) -> WorkerRegistry:
        """The workers: their states, GPUs and memory, heartbeat ages, and the capacity shares are measured against."""
        ...

    @property
    def clock(self) -> Clock:
        """The clock whose monotonic time heartbeat ages are measured on."""
        ...

    @property
    def usage(self) -> OwnerUsage:
        """What each owner's and each share's jobs hold and have used (control.shares)."""
        ...

    @property
    def watchers(self) -> Watchers:
        """The job watchers, whose ``listening`` is ``corral_watched_jobs``."""
        ...

    def state_counts(self) -> dict[JobState, int]:
        """How many jobs are in each state now; every state must be named (0 for none)."""
        ...


class StateCollector(Collector):
    """Reads queue depths, job and worker counts at scrape time (on the event loop: no locking)."""

    def __init__(self, scheduler: SchedulerView, ready: Callable[[], bool]) -> None:
        self.s = scheduler
        self.ready = ready

    def collect(self) -> Iterator[Metric]:
        """Every state metric (see the module docstring), read now: called by the registry at each scrape."""
        counts = self.s.state_counts()
        depth = GaugeMetricFamily("corral_queue_depth", "Jobs waiting: ready (PENDING) or scheduled.", labels=["queue"])
        depth.add_metric(["ready"], counts[JobState.PENDING])
        depth.add_metric(["scheduled"], counts[JobState.SCHEDULED])
        yield depth
        by_state = GaugeMetricFamily("corral_jobs", "Jobs by state.", labels=["state"])
        for state, n in counts.items():
            by_state.add_metric([state.name], n)
        yield by_state
        yield GaugeMetricFamily("corral_dead_letter_jobs", "FAILED jobs (dead-letter queue).", counts[JobState.FAILED])
        workers = self.s.registry.all()
        by_worker = {s: 0 for s in WorkerState}
        for w in workers:
            by_worker[w.state] += 1
        wstate = GaugeMetricFamily("corral_workers", "Workers by state.", labels=["state"])
        for ws, n in by_worker.items():
            wstate.add_metric([ws.name], n)
        yield wstate
        connected = [w for w in workers if w.connected]
        for name, what, held, free in (
            ("corral_gpus", "GPUs", "held_gpus", "free_gpus"),
            ("corral_memory_mb", "Memory (MiB)", "held_memory_mb", "free_memory_mb"),
        ):
            family = GaugeMetricFamily(
                name, f"{what} the connected workers give to jobs: held by running jobs, or free.", labels=["state"]
            )
            family.add_metric(["held"], sum(getattr(w, held) for w in connected))
            family.add_metric(["free"], sum(max(0, getattr(w, free)) for w in connected))
            yield family
        steady = self.s.clock.monotonic()
        oldest = max((steady - w.heard_at for w in workers), default=0.0)
        yield GaugeMetricFamily(
            "corral_worker_heartbeat_age_max_seconds",
            "Seconds since the least recently heard worker.",
            max(0.0, oldest),
        )
        yield GaugeMetricFamily("corral_ready", "1 while the control plane is ready (as /readyz).", int(self.ready()))
        yield GaugeMetricFamily(
            "corral_watched_jobs",
            "Jobs followed by open streams (WatchJob, WatchJobs, RunJob, RunJobs, WatchOutput), one per job per stream.",
            self.s.watchers.listening,
        )
        usage = self.s.usage
        used = CounterMetricFamily(
            "corral_owner_thread_seconds",
            "Thread-seconds of the leases each owner's jobs held (threads granted x time leased), any outcome.",
            labels=["owner", "group"],
        )
        group_of = usage.group_of
        for owner, seconds in usage.thread_seconds.items():
            used.add_metric([owner, group_of.get(owner, "")], seconds)
        yield used
        gpu_used = CounterMetricFamily(
            "corral_owner_gpu_seconds",
            "GPU-seconds of the leases each owner's jobs held (GPUs held x time leased), any outcome.",
            labels=["owner", "group"],
        )
        for owner, seconds in usage.gpu_seconds.items():
            gpu_used.add_metric([owner, group_of.get(owner, "")], seconds)
        yield gpu_used
        running = GaugeMetricFamily(
            "corral_owner_running_jobs", "Each owner's RUNNING jobs now.", labels=["owner", "group"]
        )
        for owner, n in usage.running_jobs.items():
            running.add_metric([owner, group_of.get(owner, "")], n)
        yield running
        capacity = self.s.registry.capacity()
        dominant = GaugeMetricFamily(
            "corral_share_dominant",
            "Each share's (a group's, or an owner's in none) dominant share now: the largest part of the "
            "connected workers' threads, GPUs or memory its running jobs hold (what fair share evens out).",
            labels=["share"],
        )
        for share in sorted(usage.shares()):
            dominant.add_metric([share], usage.dominant_share(share, capacity))
        yield dominant
        recent = GaugeMetricFamily(
            "corral_share_recent",
            "Each share's dominant share lately (CORRAL_FAIR_SHARE_HALF_LIFE_SEC; none without it): its "
            "holdings averaged over time, what it held one half-life ago counting half; fair share ranks by "
            "this plus what it holds now.",
            labels=["share"],
        )
        for share in sorted(usage.remembered()):
            recent.add_metric([share], usage.recent_share(share, capacity))
        yield recent


class ExecLimitsCollector(Collector):
    """Reads how many jobs each execution rate limit holds back, at scrape time."""

    def __init__(self, limits: ExecLimits) -> None:
        self.limits = limits

    def collect(self) -> Iterator[Metric]:
        """``corral_exec_rate_waiting_jobs{limit}``, read now: the jobs each rule holds back, by its target."""
        waiting = GaugeMetricFamily(
            "corral_exec_rate_waiting_jobs", "Jobs parked by an execution rate limit now.", labels=["limit"]
        )
        for gate in self.limits.gates:
            waiting.add_metric([gate.rule.target], gate.waiting)
        yield waiting
