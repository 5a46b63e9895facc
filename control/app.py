"""ControlPlane: the composition root. It builds the components, starts them in dependency order
(store -> scheduler -> sessions/reaper -> gRPC server) and stops them in reverse."""

from __future__ import annotations

import asyncio
import logging
import random
from types import TracebackType

import grpc

from control.api import AdminServicer, Health, JobServicer, WorkerServicer, create_server
from control.clock import Clock, SystemClock
from control.config import ControlConfig
from control.reaper import Reaper
from control.scheduler import Scheduler
from control.sessions import WorkerSessions
from control.store import Store, open_store
from corral import logs

logger = logging.getLogger(__name__)


class ControlPlane:
    """One control-plane process: ``async with ControlPlane(config) as cp: ...``."""

    def __init__(self, config: ControlConfig, clock: Clock | None = None, rng: random.Random | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.rng = rng
        self.grpc_port = 0
        self.store: Store | None = None
        self.scheduler: Scheduler | None = None
        self.health = Health()
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False

    async def start(self) -> None:
        cfg = self.config
        self.store = open_store(cfg.db, sync=cfg.db_sync)
        scheduler = self.scheduler = Scheduler(self.store, cfg, self.clock, self.rng)
        scheduler.recover()
        sessions = WorkerSessions(scheduler)
        reaper = Reaper(scheduler)
        scheduler.on_change = self._update_readiness
        self._server, self.grpc_port = create_server(
            f"{cfg.host}:{cfg.grpc_port}",
            JobServicer(scheduler),
            WorkerServicer(sessions),
            AdminServicer(sessions),
            self.health,
        )
        await self._server.start()
        await self.health.start()
        self._tasks = [asyncio.ensure_future(scheduler.run_timer()), asyncio.ensure_future(reaper.run())]
        scheduler.dispatch_soon()
        logger.info(
            logs.CONTROL_STARTED,
            extra={"grpc": f"{cfg.host}:{self.grpc_port}", "db": cfg.db, "recovered_jobs": len(scheduler.active)},
        )

    def _update_readiness(self) -> None:
        s = self.scheduler
        ready = s is not None and s.store.healthy and any(w.connected and not w.draining for w in s.registry.all())
        self.health.update(ready)

    async def wait(self) -> None:
        """Block until the server terminates."""
        if self._server is not None:
            await self._server.wait_for_termination()

    async def stop(self) -> None:
        """Stop intake, let in-flight calls finish (up to the shutdown grace), persist, close. Idempotent.

        Running jobs stay RUNNING: their workers keep them going, reconnect to the next control plane
        and are re-adopted there, so a restart re-runs nothing."""
        if self._stopped:
            return
        self._stopped = True
        logger.info(logs.CONTROL_STOPPING)
        if self._server is not None:
            await self.health.shutdown()
            if self.scheduler is not None:
                for w in self.scheduler.registry.all():
                    if w.link is not None:
                        w.link.close()
            await self._server.stop(self.config.shutdown_grace_sec)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.store is not None:
            try:
                await self.store.commit()
            except Exception:
                logger.exception("final_commit_failed")
            self.store.close()
        logger.info(logs.CONTROL_STOPPED)

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
