"""ContainerFleet: the docker mode's worker containers, kept in step with Docker and the registry.

* :meth:`ContainerFleet.refresh` lists this group's containers. On the first listing it adopts those
  that already run (``worker_container_adopted``) instead of starting duplicates. A container that
  exited by itself with code 0 (a worker that drained and left) is removed; any other exit (killed,
  crashed, OOM) is removed and replaced at once (``worker_container_replaced``).
* :meth:`ContainerFleet.start` starts containers (in parallel).
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
import time
from collections.abc import Callable

from control.autoscale.docker_backend import BackendError, DockerBackend, WorkerContainer
from control.autoscale.policy import WorkerLoad, choose_victims
from control.metrics import Metrics
from control.registry import WorkerEntry
from control.scheduler import Scheduler
from control.sessions import WorkerSessions
from corral import logs

__all__ = ["REGISTER_TIMEOUT_SEC", "ContainerFleet"]

logger = logging.getLogger(__name__)

REGISTER_TIMEOUT_SEC = 60.0
"""A container whose worker has not registered after this is reported (wrong address or image?)."""
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
        """``on_error(kind, message)`` reports failures that happen outside a look (removals)."""
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
        self._seen_at: dict[str, float] = {}
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
        """Starting containers older than REGISTER_TIMEOUT_SEC."""
        now = time.monotonic()
        return sorted(w for w in self.starting() if now - self._seen_at.get(w, now) > REGISTER_TIMEOUT_SEC)

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
        live: dict[str, WorkerContainer] = {}
        for c in listed:
            if c.live or c.status == "paused":
                live[c.worker_id] = c
                if c.worker_id not in self.containers:
                    self._seen_at[c.worker_id] = time.monotonic()
                    if self._first_listing:
                        logger.info(
                            logs.WORKER_CONTAINER_ADOPTED,
                            extra={"worker_id": c.worker_id, "container": c.id[:12], "status": c.status},
                        )
        self._first_listing = False
        self.containers = live
        self._seen_at = {wid: at for wid, at in self._seen_at.items() if wid in live}
        for c in listed:
            # A retiring worker's container is removed by its own task, whatever state it is in.
            if c.worker_id not in live and c.worker_id not in self.retiring and c.status != "removing":
                await self._remove_exited(c)

    async def _remove_exited(self, c: WorkerContainer) -> None:
        await asyncio.to_thread(self.backend.remove, c.id)
        if c.exited_cleanly:
            logger.info(
                logs.WORKER_CONTAINER_REMOVED,
                extra={"worker_id": c.worker_id, "container": c.id[:12], "exit_code": c.exit_code},
            )
            return
        # Retiring containers may run their jobs for a long while yet: they still count toward the bound.
        replacement = await self._start_one() if len(self.live()) + len(self.retiring) < self.max_workers else None
        self.metrics.autoscaler_replaced.inc()
        logger.warning(
            logs.WORKER_CONTAINER_REPLACED,
            extra={
                "worker_id": c.worker_id,
                "container": c.id[:12],
                "status": c.status,
                "exit_code": c.exit_code,
                "oom_killed": c.oom_killed,
                "replacement": replacement,
            },
        )

    # ---- scale up -------------------------------------------------------------------------------
    async def start(self, n: int) -> None:
        """Start ``n`` containers at once; the first failure is raised after all have been tried."""
        results = await asyncio.gather(*(self._start_one() for _ in range(n)), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _start_one(self) -> str:
        worker_id = self.backend.new_worker_id(self.backend.spec.group)
        c = await asyncio.to_thread(self.backend.start, worker_id)
        self.containers[worker_id] = c
        self._seen_at[worker_id] = time.monotonic()
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
        give_up = time.monotonic() + give_up_sec
        try:
            while time.monotonic() < give_up:
                w = self.s.registry.get(worker_id)
                if w is None or (not w.connected and not w.running):
                    break
                await asyncio.sleep(poll_sec)
            else:
                self.on_error("drain_timeout", f"worker {worker_id} did not leave after its drain; removing it anyway")
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
