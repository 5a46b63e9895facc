"""Autoscaler: every AUTOSCALE_INTERVAL, look at the queue, ask the policy, and act or recommend.

Modes (AUTOSCALE_MODE):

* ``off``: no loop; GET /v1/autoscaler reports the connected workers.
* ``recommend``: decisions are logged (``scale_recommendation``), counted
  (``corral_autoscaler_decisions_total``) and shown in GET /v1/autoscaler; nothing is started. The
  bounds count the connected workers that take work.
* ``docker``: each look first refreshes the worker containers (:mod:`.fleet`: adopt, remove the
  exited and those never started, replace the crashed and those whose worker never registered, with a
  backoff while they die soon after they start), then acts: up starts containers (``scale_up``), down drains the
  chosen workers and removes their containers once they left (``scale_down``). The bounds count
  this group's containers, running or starting; other workers only add free capacity. Containers
  drained and not removed yet still count toward MAX_WORKERS (they finish their jobs first).

The backlog is the PENDING jobs less those a new worker could not run either: jobs that ask for GPUs
(the containers it starts get none), jobs whose worker selector asks for a label a new container does
not carry (it has only ``container=<its own id>`` and ``autoscale_group=<CORRAL_AUTOSCALE_GROUP>``:
such jobs wait for the workers that carry it, and counting them would keep the fleet at MAX_WORKERS
for as long as they wait), jobs of a type the new worker would not run (as the workers it is like
registered their types: this group's containers in docker mode, the connected workers in recommend
mode; while none has, every type counts), jobs asking more memory (``memory_mb``) than a new container
offers (:attr:`Autoscaler.container_memory_mb`), jobs parked in the gate of an execution rate limit
(waiting for its next token; once the gate released them they wait for a worker, and are backlog again)
and the jobs an owner's running cap (CORRAL_OWNER_MAX_RUNNING) holds back: of a capped owner's ready
jobs at most ``cap - running`` are backlog (the rest wait for its own jobs to end, not for a worker;
counting them would start containers that sit idle). None of them is in the ``ready_jobs`` that GET
/v1/autoscaler and the decision logs show.

Every look's decision is counted by action and reason; actions are logged at info, and a change of
the reason for doing nothing at debug. When Docker is unreachable or WORKER_IMAGE is missing the look
fails with a clear error (``autoscaler_error`` in the log, ``last_error`` in GET /v1/autoscaler,
``corral_autoscaler_errors_total{kind}``); the control plane keeps serving and the next look retries.
Crashed containers, workers that never register and a running crash backoff are reported the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from control.autoscale.docker_backend import WORKER_LABEL_GROUP, BackendError, ContainerSpec, DockerBackend
from control.autoscale.fleet import ContainerFleet
from control.autoscale.policy import Action, Decision, ScalePolicy, ScaleSettings, Snapshot
from control.clock import Clock
from control.config import ControlConfig
from control.jobs import JobState
from control.metrics import Metrics
from control.scheduler import Scheduler
from control.sessions import WorkerSessions
from control.tls import ContainerTls
from corral import logs
from corral.resources import memory_share_mb
from corral.transport import host_port, loopback

__all__ = ["SCAN_LIMIT", "Autoscaler", "AutoscalerState", "container_memory_mb"]

logger = logging.getLogger(__name__)

SCAN_LIMIT = 20_000
"""Ready jobs read per look to sum their threads and find the oldest; past it the threads are
extrapolated (a backlog that large is far over any threshold anyway), so a look stays cheap."""
ERROR_LOG_EVERY_SEC = 30.0
"""The same error is logged again at most this often (it is counted every time)."""


@dataclass(slots=True)
class AutoscalerState:
    """What GET /v1/autoscaler shows."""

    mode: str
    min_workers: int
    max_workers: int
    current: int = 0
    desired: int = 0
    starting: int = 0
    draining: int = 0
    snapshot: Snapshot | None = None
    last_decision: Decision | None = None
    last_decision_at: float = 0.0
    last_action: Decision | None = None
    last_action_at: float = 0.0
    last_error: str = ""
    last_error_at: float = 0.0
    scale_ups: int = 0
    scale_downs: int = 0
    cooldown_remaining: float = 0.0


class Autoscaler:
    """The loop of the module docstring: ``await start(grpc_port)`` ... ``await stop()``."""

    def __init__(
        self,
        config: ControlConfig,
        scheduler: Scheduler,
        sessions: WorkerSessions,
        metrics: Metrics,
        clock: Clock,
        backend: DockerBackend | None = None,
    ) -> None:
        """Build it; nothing runs before :meth:`start`. ``backend`` replaces the Docker backend (tests)."""
        self.config = config
        self.s = scheduler
        self.sessions = sessions
        self.metrics = metrics
        self.clock = clock
        self.mode = config.autoscale_mode
        self.settings = ScaleSettings(
            min_workers=config.min_workers,
            max_workers=config.max_workers,
            threshold_high=config.queue_threshold_high,
            threshold_low=config.queue_threshold_low,
            stable_sec=config.scale_down_stable_sec,
            cooldown_sec=config.scale_cooldown_sec,
            max_wait_sec=config.scale_max_wait_sec,
            threads_per_worker=config.worker_threads,
        )
        self.policy = ScalePolicy(self.settings)
        self.container_memory_mb = container_memory_mb(config)
        """The memory a new worker container offers jobs (CORRAL_AUTOSCALE_WORKER_MEMORY_MB or its default)."""
        self.state = AutoscalerState(config.autoscale_mode, config.min_workers, config.max_workers)
        self.backend = backend
        self.fleet: ContainerFleet | None = None
        self._task: asyncio.Task[None] | None = None
        self._none_reason = ""
        self._error_logged: tuple[str, float] = ("", 0.0)
        self._failed_this_look = False

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self, grpc_port: int, worker_port: int = 0) -> None:
        """Start the loop (not in mode off); worker containers dial CORRAL_AUTOSCALE_CONTROL_ADDRESS,
        else this machine's ``worker_port`` (the mutual-TLS worker port, when there is one) or ``grpc_port``."""
        if self.mode == "off" or self._task is not None:
            return
        cfg = self.config
        if self.mode == "docker":
            if self.backend is None:
                spec = ContainerSpec(
                    image=cfg.worker_image,
                    group=cfg.autoscale_group,
                    control_address=cfg.autoscale_control_address
                    or host_port(loopback(cfg.host), worker_port or grpc_port),
                    threads=cfg.worker_threads,
                    memory_mb=self.container_memory_mb,
                    network=cfg.worker_network,
                    token=cfg.worker_token,
                    tls=(
                        ContainerTls.load(cfg.autoscale_tls_ca, cfg.autoscale_tls_cert, cfg.autoscale_tls_key)
                        if cfg.autoscale_tls_ca
                        else None
                    ),
                )
                self.backend = DockerBackend(spec)
            self.fleet = ContainerFleet(
                self.backend, self.s, self.sessions, self.metrics, cfg.max_workers, on_error=self._error
            )
        logger.info(
            logs.AUTOSCALER_STARTED,
            extra={
                "mode": self.mode,
                "interval_sec": cfg.autoscale_interval_sec,
                "min_workers": cfg.min_workers,
                "max_workers": cfg.max_workers,
                "container_memory_mb": self.container_memory_mb,
                **({"image": cfg.worker_image, "group": cfg.autoscale_group} if self.fleet else {}),
            },
        )
        self._task = asyncio.create_task(self._run(), name="corral-autoscaler")

    async def stop(self) -> None:
        """Stop the loop; containers keep running (the next control plane adopts them). Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.fleet is not None:
            await self.fleet.stop()

    def status(self) -> AutoscalerState:
        """The state GET /v1/autoscaler shows (in mode off: the connected workers that take work)."""
        st = self.state
        if self.mode == "off":
            st.current = st.desired = self._accepting_workers()
        else:
            st.cooldown_remaining = self.policy.cooldown_left(self.clock.now())
        if self.fleet is not None:
            st.draining = len(self.fleet.retiring)
        return st

    async def _run(self) -> None:
        while True:
            try:
                await self.look()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not end the loop: report it and look again
                logger.exception(logs.AUTOSCALER_ERROR, extra={"kind": "internal"})
                self._error("internal", f"autoscaler look failed: {exc!r}")
            await asyncio.sleep(self.config.autoscale_interval_sec)

    # ---- one look -------------------------------------------------------------------------------
    async def look(self) -> Decision | None:
        """Observe, decide, act (docker) or recommend; returns the decision (None when Docker failed)."""
        self._failed_this_look = False
        if self.fleet is not None:
            try:
                decision = await self._look_docker(self.fleet)
            except BackendError as exc:
                self._error(exc.kind, exc.message)
                return None
        else:
            decision = self._decide(self._observe(self._accepting_workers(), 0, self._idle_workers()))
            if decision.action is not Action.NONE:
                self._acted(decision, logs.SCALE_RECOMMENDATION)
        if not self._failed_this_look and self.state.last_error:
            logger.info(logs.AUTOSCALER_RECOVERED, extra={"previous_error": self.state.last_error})
            self.state.last_error = ""
        return decision

    async def _look_docker(self, fleet: ContainerFleet) -> Decision:
        await fleet.refresh()
        decision = self._decide(
            self._observe(len(fleet.live()), len(fleet.starting()), fleet.idle(), len(fleet.retiring), fleet.held())
        )
        if decision.action is Action.UP:
            started, refused = await fleet.start(decision.step)
            # Only what started is an action: a start Docker refused is no scale-up, counts none and opens
            # no cooldown (the crash backoff spaces the retries out instead).
            if started:
                step = len(started)
                done = dataclasses.replace(decision, step=step, desired=decision.desired - decision.step + step)
                self._acted(done, logs.SCALE_UP, workers=started)
            if refused is not None:
                raise BackendError(
                    refused.kind,
                    f"scale up +{decision.step} ({decision.reason}): {decision.step - len(started)} of "
                    f"{decision.step} worker container starts failed: {refused.message}",
                )
        elif decision.action is Action.DOWN:
            poll = min(0.1, self.config.autoscale_interval_sec)
            victims = fleet.retire(decision.step, self.config.heartbeat_timeout_sec, poll)
            self._acted(decision, logs.SCALE_DOWN, workers=victims)
        return decision

    # ---- observation ----------------------------------------------------------------------------
    def _observe(self, workers: int, starting: int, idle: int, retiring: int = 0, held: float = 0.0) -> Snapshot:
        s, tpw = self.s, self.settings.threads_per_worker
        ready_jobs = s.counts.get(JobState.PENDING, 0)
        # Jobs a gate of an execution rate limit holds now wait for a token, not for a worker: not
        # backlog. Once released they are (a fast limit releases a whole backlog long before the jobs
        # start). They are told apart job by job, so that one that is also unfit below is not taken out
        # twice, and the oldest is a job that waits for a worker.
        limits = s.exec_limits
        parked = limits.parked() if limits is not None else 0
        threads = seen = seen_parked = unfit = 0
        oldest = None
        # The one label a selector may ask for that a container about to be started carries (the other,
        # container=<id>, names one existing container).
        group = (WORKER_LABEL_GROUP, self.config.autoscale_group)
        types = self._new_worker_types() if ready_jobs else None
        memory = self.container_memory_mb
        # An owner at its running cap (control.shares: OwnerQueues.pop skips it while its running jobs
        # reach the cap) gets no more of its jobs started by more workers: at most cap - running of its
        # ready jobs are backlog, the rest wait for its own jobs to end.
        rules, running = s.shares, s.usage.running_jobs
        room: Counter[str] = Counter()
        capped = 0
        if ready_jobs:
            for job in s.active.values():
                if job.state is JobState.PENDING:
                    seen += 1
                    if parked and limits is not None and limits.is_parked(job.id):
                        seen_parked += 1
                    # The workers it starts have no GPUs, no labels but the group's, and the image's job
                    # types: one more would not run such a job.
                    elif (
                        job.gpu_count
                        or job.memory_mb > memory
                        or any(pair != group for pair in job.worker_selector)
                        or (types is not None and job.type not in types)
                    ):
                        unfit += 1
                    elif (cap := rules.cap(job.owner)) and (
                        room.setdefault(job.owner, max(0, cap - running[job.owner])) <= 0
                    ):
                        capped += 1
                    else:
                        if cap:
                            room[job.owner] -= 1
                        threads += min(job.thread_demand, tpw)
                        oldest = job.ready_at if oldest is None else min(oldest, job.ready_at)
                    if seen >= SCAN_LIMIT:
                        break
            # Past the scan, the jobs not parked are taken to be like those seen.
            unfit += capped
            waiting, waiting_seen = max(0, ready_jobs - parked), seen - seen_parked
            if 0 < waiting_seen < waiting:
                threads = threads * waiting // waiting_seen
                unfit = unfit * waiting // waiting_seen
            elif waiting_seen == 0:
                threads = waiting  # every job seen was parked: a thread each, the least any asks for
            ready_jobs = max(0, waiting - unfit)
        free = sum(max(0, w.free_threads) for w in s.registry.all() if w.accepts_work)
        age = max(0.0, self.clock.now() - oldest) if oldest is not None else 0.0
        return Snapshot(ready_jobs, threads, age, free, workers, starting, idle, retiring, held)

    def _new_worker_types(self) -> frozenset[str] | None:
        """The job types a worker it would start runs, as the workers of that kind registered them (docker
        mode: this group's containers, connected or not; recommend mode: the connected workers); None
        while none has registered, or when one runs any type."""
        if self.fleet is not None:
            found = (self.s.registry.get(wid) for wid in self.fleet.containers)
            like = [w for w in found if w is not None]
        else:
            like = [w for w in self.s.registry.all() if w.connected]
        if not like or any(not w.job_types for w in like):
            return None
        return frozenset().union(*(w.job_types for w in like))

    def _accepting_workers(self) -> int:
        return sum(1 for w in self.s.registry.all() if w.connected and not w.draining)

    def _idle_workers(self) -> int:
        return sum(1 for w in self.s.registry.all() if w.connected and not w.draining and not w.running)

    # ---- decisions ------------------------------------------------------------------------------
    def _decide(self, snap: Snapshot) -> Decision:
        now = self.clock.now()
        decision = self.policy.decide(snap, now)
        st = self.state
        st.snapshot, st.last_decision, st.last_decision_at = snap, decision, now
        st.current, st.desired, st.starting = snap.workers, decision.desired, snap.starting
        st.draining = len(self.fleet.retiring) if self.fleet is not None else 0
        st.cooldown_remaining = self.policy.cooldown_left(now)
        self.metrics.autoscaler_decisions.labels(decision.action.value, decision.reason).inc()
        gauge = self.metrics.autoscaler_workers
        for name, value in (("current", st.current), ("desired", st.desired), ("starting", st.starting)):
            gauge.labels(name).set(value)
        gauge.labels("draining").set(st.draining)
        if decision.action is Action.NONE and decision.reason != self._none_reason:
            logger.debug(logs.SCALE_DECISION, extra=_fields(decision, snap))
        self._none_reason = decision.reason if decision.action is Action.NONE else ""
        return decision

    def _acted(self, decision: Decision, event: str, **extra: Any) -> None:
        now = self.clock.now()
        self.policy.acted(now)
        st = self.state
        st.last_action, st.last_action_at = decision, now
        st.cooldown_remaining = self.policy.cooldown_left(now)
        if decision.action is Action.UP:
            st.scale_ups += 1
        else:
            st.scale_downs += 1
        assert st.snapshot is not None
        logger.info(event, extra={"mode": self.mode, **_fields(decision, st.snapshot), **extra})

    # ---- errors ---------------------------------------------------------------------------------
    def _error(self, kind: str, message: str) -> None:
        self._failed_this_look = True
        now = self.clock.now()
        self.metrics.autoscaler_errors.labels(kind).inc()
        last_message, logged_at = self._error_logged
        if message != last_message or now - logged_at >= ERROR_LOG_EVERY_SEC:
            logger.error(logs.AUTOSCALER_ERROR, extra={"kind": kind, "error": message})
            self._error_logged = (message, now)
        self.state.last_error, self.state.last_error_at = message, now


def container_memory_mb(config: ControlConfig) -> int:
    """What one worker container offers jobs, in MiB: CORRAL_AUTOSCALE_WORKER_MEMORY_MB, else this machine's
    memory (or its cgroup's limit) divided by MAX_WORKERS (:func:`corral.resources.memory_share_mb`, as
    ``corral up`` shares it out among its workers), so that a full fleet does not promise more memory than
    the host has."""
    if config.autoscale_worker_memory_mb is not None:
        return config.autoscale_worker_memory_mb
    return memory_share_mb(config.max_workers)


def _fields(decision: Decision, snap: Snapshot) -> dict[str, Any]:
    return {
        "action": decision.action.value,
        "step": decision.step,
        "reason": decision.reason,
        "current": snap.workers,
        "desired": decision.desired,
        "ready_jobs": snap.ready_jobs,
        "ready_threads": snap.ready_threads,
        "oldest_ready_age_sec": round(snap.oldest_ready_age, 3),
        "free_threads": snap.free_threads,
        "starting": snap.starting,
        "detail": decision.detail,
    }
