"""ContainerFleet: the docker mode's worker containers, kept in step with Docker and the registry.

* :meth:`ContainerFleet.refresh` lists this group's containers. On the first listing it adopts those
  that already run (``worker_container_adopted``) instead of starting duplicates. A container that
  exited by itself with code 0 (a worker that drained and left) is removed; any other exit (killed,
  crashed, OOM) is removed and replaced (``worker_container_replaced``), and so is a container whose
  worker has not been connected for REGISTER_TIMEOUT_SEC (:meth:`~ContainerFleet.late`): else it would
  count as starting for ever, toward MAX_WORKERS and against every scale-down. A container this process
  started that exits 0 before its worker ever registered did not leave, it failed (an image that does
  not run the worker): it is replaced like a crash, with the backoff, else it would be started again at
  every look for ever. A container it counted that Docker no longer lists at all (``docker rm -f``) is
  replaced too (reason ``vanished``): its jobs are lost like a crash's. A container still
  ``created`` that this process is not starting (a control plane stopped between Docker's create and
  start, or a create that timed out on the client) never gets a worker: it is removed
  (``worker_container_removed``, reason ``never_started``). Failures are reported through
  ``on_error`` (``last_error`` in GET /v1/autoscaler). When containers die soon after they start, the
  replacements are spaced out (:class:`~control.autoscale.policy.CrashBackoff`: the wait doubles, up to
  a cap, until one stays up) and :meth:`~ContainerFleet.held` holds the policy's steps up as well.
* :meth:`ContainerFleet.start` starts containers (in parallel) and says which started (the autoscaler
  counts only those as a scale-up). A start Docker refuses (a bad network,
  the image gone) is one failure of the same backoff, and its error stays in ``last_error`` until a
  start succeeds (the looks that start nothing meanwhile do not clear it).
* :meth:`ContainerFleet.retire` drains the chosen workers through the control plane (idle ones
  first, with a deadline past their jobs' own leases, so no job is cut short); a task per worker
  waits until it has no running job and has disconnected, and only then stops and removes its
  container (``worker_container_removed``). Until then the container is :attr:`~ContainerFleet.retiring`:
  out of :meth:`~ContainerFleet.live`, but still counted toward MAX_WORKERS.

Every Docker call runs in a thread (``asyncio.to_thread``): the event loop never waits on Docker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from control.autoscale.docker_backend import BackendError, DockerBackend, WorkerContainer
from control.autoscale.policy import CrashBackoff, WorkerLoad, choose_victims
from control.metrics import Metrics
from control.registry import WorkerEntry
from control.scheduler import Scheduler
from control.sessions import WorkerSessions
from corral import logs

__all__ = ["REGISTER_TIMEOUT_SEC", "ContainerFleet"]

logger = logging.getLogger(__name__)

REGISTER_TIMEOUT_SEC = 60.0
"""A live container whose worker has not been connected (nor held a job) for this long is removed and
replaced (wrong address or image?)."""
LEAVE_MARGIN_SEC = 30.0
"""How long past its drain deadline (and the heartbeat timeout) a drained worker may take to leave
before its container is removed anyway."""


class ContainerFleet:
    """This control plane's worker containers (one CORRAL_AUTOSCALE_GROUP)."""

    def __init__(
        self,
        backend: DockerBackend,
        scheduler: Scheduler,
        sessions: WorkerSessions,
        metrics: Metrics,
        max_workers: int,
        on_error: Callable[[str, str], None],
    ) -> None:
        """``on_error(kind, message)`` reports failures: crashes, workers that never register, removals.
        Time is the scheduler's clock's (:meth:`~control.clock.Clock.monotonic`)."""
        self.backend = backend
        self.s = scheduler
        self.sessions = sessions
        self.metrics = metrics
        self.max_workers = max_workers
        self.on_error = on_error
        self.containers: dict[str, WorkerContainer] = {}
        """Live containers by worker id, as of the last listing (plus those started since)."""
        self.retiring: dict[str, asyncio.Task[None]] = {}
        """Workers drained for removal, by id, and the task that removes their container."""
        self.backoff = CrashBackoff()
        """Holds the starts while containers die soon after they start."""
        self._started_at: dict[str, float] = {}
        """When each live container was started (or first seen, when adopted)."""
        self._unconnected_since: dict[str, float] = {}
        """Since when each live container's worker has not been connected, as of the last look."""
        self._launching: set[str] = set()
        """Workers whose container this process is creating and starting now: ``created`` is expected."""
        self._crash_note = ""
        self._registered_once: set[str] = set()
        """Live containers whose worker has been connected at least once (as of the looks so far)."""
        self._started_here: set[str] = set()
        """Live containers this process started (not adopted)."""
        self._removed: set[str] = set()
        """Workers whose container this process removed (or is removing): not to be taken for vanished."""
        self._start_failure: tuple[str, str] | None = None
        """(kind, message) of the last start Docker refused, until a start succeeds: kept in last_error."""
        self._connected = False
        self._first_listing = True

    # ---- what there is ---------------------------------------------------------------------------
    def live(self) -> list[str]:
        """Worker ids of the containers that count: running or starting, not being retired."""
        return [wid for wid in self.containers if wid not in self.retiring]

    def idle(self) -> int:
        """How many of the workers :meth:`retire` may choose run no job: the most a scale-down may
        remove without draining a busy one."""
        return sum(1 for w in self._candidates() if w.running_jobs == 0)

    def starting(self) -> list[str]:
        """Of :meth:`live`, those whose worker has not registered (or is not connected) yet."""
        return [wid for wid in self.live() if not self._registered(wid)]

    def late(self) -> list[str]:
        """Starting containers whose worker has not been connected, nor held a job, for REGISTER_TIMEOUT_SEC:
        :meth:`refresh` removes and replaces them."""
        now = self._now()
        return sorted(
            wid
            for wid in self.starting()
            if now - self._unconnected_since.get(wid, now) > REGISTER_TIMEOUT_SEC and not self._holds_jobs(wid)
        )

    def held(self) -> float:
        """Seconds before a container may be started again (containers died soon after they started)."""
        return self.backoff.held(self._now())

    def _holds_jobs(self, worker_id: str) -> bool:
        # A worker that lost its connection keeps its leases until the reaper takes them back: its
        # container is not removed under them.
        w = self.s.registry.get(worker_id)
        return w is not None and bool(w.running)

    def _now(self) -> float:
        return self.s.clock.monotonic()

    def _registered(self, worker_id: str) -> bool:
        w = self.s.registry.get(worker_id)
        return w is not None and w.connected

    # ---- refresh: adopt, remove, replace ----------------------------------------------------------
    async def refresh(self) -> None:
        """Connect if needed, list the containers, and reconcile (see the module docstring).

        Raises:
            BackendError: Docker is unreachable, the image is missing, or the API refused.
        """
        backend = self.backend
        try:
            if not self._connected:
                await asyncio.to_thread(backend.connect)
                self._connected = True
            listed = await asyncio.to_thread(backend.containers)
        except BackendError as exc:
            if exc.kind != "docker_api":
                self._connected = False
            raise
        now = self._now()
        listed_ids = {c.worker_id for c in listed}
        # Containers this process counted and did not remove, gone from Docker altogether (docker rm -f, or
        # a daemon that lost them): their workers' jobs are lost like a crash's, and they count no more.
        # One caught half-way (``removing``) is as gone: it would leave the view without a word otherwise.
        ours = self.retiring.keys() | self._removed | self._launching
        vanished = [c for wid, c in self.containers.items() if wid not in listed_ids and wid not in ours]
        vanished += [
            c for c in listed if c.status == "removing" and c.worker_id in self.containers and c.worker_id not in ours
        ]
        self._removed.update(c.worker_id for c in vanished)  # reported once
        live: dict[str, WorkerContainer] = {}
        for c in listed:
            never_started = c.status == "created" and c.worker_id not in self._launching
            if (c.live or c.status == "paused") and not never_started:
                live[c.worker_id] = c
                if c.worker_id not in self.containers:
                    self._started_at.setdefault(c.worker_id, now)
                    if self._first_listing:
                        logger.info(
                            logs.WORKER_CONTAINER_ADOPTED,
                            extra={"worker_id": c.worker_id, "container": c.id[:12], "status": c.status},
                        )
        self._first_listing = False
        self.containers = live
        for wid in live:
            if self._registered(wid):
                self._registered_once.add(wid)
                self._unconnected_since.pop(wid, None)
                if self.backoff.stayed_up(self._started_at.get(wid, now), now):
                    self._crash_note = ""
            else:
                self._unconnected_since.setdefault(wid, now)
        late = [live[wid] for wid in self.late()]
        # A retiring worker's container is removed by its own task, whatever state it is in.
        gone = [c for c in listed if c.worker_id not in live and c.worker_id not in self.retiring]
        crashed = [c for c in gone if c.status not in ("removing", "created") and not self._left(c)]
        # Containers that die together are one failure: a bad image must not jump to the cap at once.
        if late or any(self.backoff.early(self._started_at.get(c.worker_id, now), now) for c in crashed):
            self.backoff.failed(now)
        for c in gone:
            if c.status == "created":
                await asyncio.to_thread(self.backend.remove, c.id)
                logger.warning(
                    logs.WORKER_CONTAINER_REMOVED,
                    extra={"worker_id": c.worker_id, "container": c.id[:12], "reason": "never_started"},
                )
            elif c.status != "removing":
                await self._remove_exited(c)
        for c in late:
            await self._replace(c, "not_registered")
        for c in vanished:
            await self._replace(c, "vanished")
        self._started_at = {wid: at for wid, at in self._started_at.items() if wid in self.containers}
        self._unconnected_since = {wid: at for wid, at in self._unconnected_since.items() if wid in self.containers}
        self._registered_once &= self.containers.keys()
        self._started_here &= self.containers.keys()
        # Forget a removal once Docker no longer lists the container, nor does the view this look built.
        self._removed = {wid for wid in self._removed if wid in listed_ids or wid in self.containers}
        if late or crashed or vanished:
            return
        last = self.backoff.last_failure_at
        if self._start_failure is not None and (
            last is None or now - last > self.backoff.cap_sec + self.backoff.stay_up_sec
        ):
            self._start_failure = None  # long ago, and nothing tried since: the series is over
        if self._start_failure is not None:
            # Docker refused the last start: say so at every look until a start succeeds (else the next
            # look, which starts nothing, would clear it as if all was well).
            self.on_error(*self._start_failure)
        elif self._crash_note and self.backoff.failing(now):
            # Keep it in last_error until a container stays up, not just at the look that saw the crash:
            # the end of a hold proves nothing.
            self.on_error("crash_backoff", self._crash_note)

    def _left(self, c: WorkerContainer) -> bool:
        """Whether ``c`` ended as a worker that leaves does: by itself, with code 0, after its worker had
        registered. One this process started that exits 0 before its worker ever registered (an image that
        does not run the worker, a worker that gives up at once) failed like a crash: else it would be
        started again at every look, for ever, with nothing in last_error. (An adopted one may have been
        drained by the previous control plane: its exit 0 is taken at its word.)"""
        if not c.exited_cleanly:
            return False
        wid = c.worker_id
        return wid not in self._started_here or wid in self._registered_once or self.s.registry.get(wid) is not None

    async def _remove_exited(self, c: WorkerContainer) -> None:
        self._removed.add(c.worker_id)
        await asyncio.to_thread(self.backend.remove, c.id)
        if self._left(c):
            logger.info(
                logs.WORKER_CONTAINER_REMOVED,
                extra={"worker_id": c.worker_id, "container": c.id[:12], "exit_code": c.exit_code},
            )
            return
        await self._replace(c, "exited")

    async def _replace(self, c: WorkerContainer, reason: str) -> None:
        """Start a container in place of ``c`` (removed already when it exited, removed here when it is
        ``late``), unless MAX_WORKERS or the crash backoff forbid it; report it either way."""
        if reason == "not_registered":
            self._removed.add(c.worker_id)
            await asyncio.to_thread(self.backend.remove, c.id)
        self.containers.pop(c.worker_id, None)
        held = self.held()
        # Retiring containers may run their jobs for a long while yet: they still count toward the bound.
        room = len(self.live()) + len(self.retiring) < self.max_workers
        replacement: str | None = None
        refused = ""
        if room and held == 0:
            try:
                replacement = await self._start_one()
            except BackendError as exc:  # reported below; the rest of the look goes on
                refused = exc.message
                self._start_refused(exc)
        self.metrics.autoscaler_replaced.inc()
        logger.warning(
            logs.WORKER_CONTAINER_REPLACED,
            extra={
                "worker_id": c.worker_id,
                "container": c.id[:12],
                "reason": reason,
                "status": c.status,
                "exit_code": c.exit_code,
                "oom_killed": c.oom_killed,
                "replacement": replacement,
                "held_sec": round(held, 1),
            },
        )
        if reason == "vanished":
            what = (
                f"worker container {c.worker_id} is gone from Docker (removed outside the autoscaler: docker rm?); "
                "its running jobs fail over like a crash's (WORKER_LOST)"
            )
        elif reason == "not_registered":
            what = (
                f"worker container {c.worker_id} not registered after {REGISTER_TIMEOUT_SEC:g}s, removed: check "
                "that containers reach the control plane (CORRAL_AUTOSCALE_CONTROL_ADDRESS, CORRAL_WORKER_NETWORK) "
                f"and their logs (docker logs {c.worker_id})"
            )
        else:
            oom = ", OOM-killed" if c.oom_killed else ""
            early = "" if c.exit_code or c.oom_killed else " before its worker registered (does WORKER_IMAGE run it?)"
            what = (
                f"worker container {c.worker_id} {c.status} with exit code {c.exit_code}{oom}{early}: "
                f"see its logs (docker logs {c.worker_id}: it was removed)"
            )
        if replacement is not None:
            outcome = f"replaced by {replacement}"
        elif refused:
            outcome = f"its replacement failed to start: {refused}"
        elif held > 0:
            outcome = (
                f"{self.backoff.failures} failures in a row soon after start: no container is started for "
                f"{held:.0f}s (the wait doubles while they go on)"
            )
        else:
            outcome = f"not replaced: MAX_WORKERS ({self.max_workers}) reached"
        self._crash_note = f"{what}; {outcome}"
        self.on_error(reason, self._crash_note)

    # ---- scale up -------------------------------------------------------------------------------
    async def start(self, n: int) -> tuple[list[str], BackendError | None]:
        """Start ``n`` containers at once; returns the worker ids of those that started and the first
        failure (None when all did), once all have been tried. Any other exception is raised.

        A start Docker refuses (not one it did not answer) counts as a failure of the crash backoff: the
        same spec is refused the same way next time, so the retries are spaced out like crashes are."""
        results = await asyncio.gather(*(self._start_one() for _ in range(n)), return_exceptions=True)
        started = [r for r in results if isinstance(r, str)]
        failure: BackendError | None = None
        for result in results:
            if isinstance(result, BackendError):
                failure = failure or result
            elif isinstance(result, BaseException):
                raise result
        if failure is not None:
            self._start_refused(failure)  # starts refused together are one failure, as before
        return started, failure

    def _start_refused(self, exc: BackendError) -> None:
        """Record a start that failed: Docker refused it (not unreachable) -> one crash-backoff failure."""
        if exc.kind == "docker_unreachable":  # not the spec's fault: the next look retries
            return
        now = self._now()
        held = self.backoff.failed(now)
        then = (
            f"no container is started for {held:.0f}s ({self.backoff.failures} failures in a row; the wait "
            "doubles while they go on)"
            if held > 0
            else "retried at the next look"
        )
        self._start_failure = (exc.kind, f"starting a worker container failed: {exc.message}; {then}")

    async def _start_one(self) -> str:
        worker_id = self.backend.new_worker_id(self.backend.spec.group)
        self._launching.add(worker_id)
        try:
            c = await asyncio.to_thread(self.backend.start, worker_id)
        finally:
            self._launching.discard(worker_id)
        self.containers[worker_id] = c
        self._started_here.add(worker_id)
        self._start_failure = None
        self._started_at[worker_id] = self._unconnected_since[worker_id] = self._now()
        logger.info(logs.WORKER_CONTAINER_STARTED, extra={"worker_id": worker_id, "container": c.id[:12]})
        return worker_id

    # ---- scale down -----------------------------------------------------------------------------
    def retire(self, n: int, heartbeat_timeout_sec: float, poll_sec: float) -> list[str]:
        """Drain ``n`` of the registered workers (idle first); their containers go once they left.

        No await between choosing and draining: the dispatcher cannot hand a victim a job meanwhile."""
        victims = choose_victims(self._candidates(), n)
        for wid in victims:
            worker = self.s.registry.get(wid)
            assert worker is not None
            deadline = self._drain_deadline(worker)
            self.sessions.drain(wid, deadline)
            give_up = deadline + heartbeat_timeout_sec + LEAVE_MARGIN_SEC
            self.retiring[wid] = asyncio.create_task(
                self._remove_when_gone(wid, self.containers[wid].id, give_up, poll_sec), name=f"corral-retire-{wid}"
            )
        return victims

    def _candidates(self) -> list[WorkerLoad]:
        """The live workers a scale-down may drain: registered, connected, not draining already."""
        candidates: list[WorkerLoad] = []
        for wid in self.live():
            w = self.s.registry.get(wid)
            if w is not None and w.connected and not w.draining:
                candidates.append(WorkerLoad(wid, len(w.running), sum(w.running.values())))
        return candidates

    def _drain_deadline(self, worker: WorkerEntry) -> float:
        """Past the lease of every job the worker runs (its timeout + grace): no job is cut short."""
        now = self.s.clock.now()
        ends = [job.lease_expires_at for job_id, _ in worker.running if (job := self.s.active.get(job_id))]
        return max([5.0] + [end - now for end in ends if end is not None])

    async def _remove_when_gone(self, worker_id: str, container_id: str, give_up_sec: float, poll_sec: float) -> None:
        give_up = self._now() + give_up_sec
        try:
            while self._now() < give_up:
                w = self.s.registry.get(worker_id)
                if w is None or (not w.connected and not w.running):
                    break
                await asyncio.sleep(poll_sec)
            else:
                self.on_error("drain_timeout", f"worker {worker_id} did not leave after its drain; removing it anyway")
            self._removed.add(worker_id)
            await asyncio.to_thread(self.backend.remove, container_id)
            logger.info(logs.WORKER_CONTAINER_REMOVED, extra={"worker_id": worker_id, "container": container_id[:12]})
        except BackendError as exc:
            self.on_error(exc.kind, exc.message)
        finally:
            self.retiring.pop(worker_id, None)
            self.metrics.autoscaler_workers.labels("draining").set(len(self.retiring))

    # ---- lifecycle ------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Stop the removal tasks (drained workers still leave; the next control plane removes their
        exited containers) and drop the Docker client."""
        tasks = list(self.retiring.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(self.backend.close)
