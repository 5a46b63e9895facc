"""Agent: one worker process's composition root; owns the runner pool and the connection.

Start order: plug-ins are imported (so the agent can advertise their job types), the pool starts
its runner processes and waits until they are ready, then the connection starts registering.
Stop order is the reverse. ``async with Agent(config)`` starts and stops it; :meth:`Agent.drain` runs
the drain procedure and then stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from corral.logs import WORKER_STARTED, WORKER_STOPPED
from worker.attempt import Completion
from worker.config import WorkerConfig
from worker.connection import Connection
from worker.drain import Drainer
from worker.pool import PoolConfig, RunnerPool

__all__ = ["Agent"]

logger = logging.getLogger(__name__)


class Agent:
    """A worker agent: ``await start()``, later ``await drain()`` or ``await stop()``."""

    def __init__(self, config: WorkerConfig) -> None:
        """Create a stopped agent."""
        self.config = config
        self.pool = RunnerPool(
            PoolConfig(
                slots=config.slots,
                imports=config.imports,
                kill_grace_sec=config.kill_grace_sec,
                memory_limit_mb=config.job_memory_limit_mb,
                max_jobs=config.runner_max_jobs,
                max_rss_mb=config.runner_max_rss_mb,
                output_bytes=config.job_output_bytes,
                gpus=config.gpus,
                threads=config.threads,
            ),
            on_result=self._on_result,
            on_printed=self._on_printed,
        )
        self.connection: Connection | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._started = False
        self._stopped = asyncio.Event()
        self._stopping = False

    async def start(self) -> None:
        """Start the runner processes (they import the plug-ins), then start connecting with the job
        types they said they run. Plug-in code never runs in the worker itself: what a plug-in does as
        it is imported (a helper it starts, a model it loads) happens in runner processes only.

        Raises:
            ImportError: a plug-in module does not import.
            RunnerStartError: the runner processes did not start.
        """
        if self._started:
            return
        self._started = True
        await self.pool.start()
        self.connection = Connection(self.config, self.pool, self.pool.job_types, on_drain=self._on_drain_requested)
        await self.connection.start()
        logger.info(
            WORKER_STARTED,
            extra={
                "worker_id": self.config.worker_id,
                "control_addr": self.config.control_addr,
                "threads": self.config.threads,
                "slots": self.config.slots,
                "gpus": ",".join(self.config.gpus),
                "memory_mb": self.config.memory_mb,
                "runner_pids": self.pool.pids(),
            },
        )

    async def drain(self, deadline_sec: float | None = None) -> None:
        """Drain (see :mod:`worker.drain`) within ``deadline_sec`` (default: the config's), then stop."""
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain(deadline_sec), name="corral-worker-drain")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(self._drain_task)

    async def stop(self) -> None:
        """Stop now: drop the stream, kill the runner processes. Idempotent; safe before start."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            drain = self._drain_task
            if drain is not None and not drain.done() and drain is not asyncio.current_task():
                drain.cancel()
            if self.connection is not None:
                await self.connection.stop()
            await self.pool.stop()
        finally:
            if self._started:
                logger.info(WORKER_STOPPED, extra={"worker_id": self.config.worker_id})
            self._stopped.set()

    async def wait_stopped(self) -> None:
        """Wait until the agent has stopped (after a drain, a stop, or a Drain from the control plane)."""
        await self._stopped.wait()

    @property
    def stopping(self) -> bool:
        """Whether a stop has begun (asked for, or at the end of a drain)."""
        return self._stopping

    @property
    def draining(self) -> bool:
        """Whether a drain has begun."""
        return self._drain_task is not None

    async def __aenter__(self) -> Agent:
        """Start the agent."""
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the agent."""
        await self.stop()

    async def _drain(self, deadline_sec: float | None) -> None:
        if self.connection is not None and not self._stopping:
            await Drainer(self.pool, self.connection).run(
                self.config.drain_timeout_sec if deadline_sec is None else deadline_sec
            )
        await self.stop()

    def _on_drain_requested(self, deadline_sec: float) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(
                self._drain(deadline_sec if deadline_sec > 0 else None), name="corral-worker-drain"
            )

    def _on_result(self, completion: Completion) -> None:
        if self.connection is not None:
            self.connection.report(completion)

    def _on_printed(self, job_id: str, attempt: int, offset: int, text: str) -> None:
        if self.connection is not None:
            self.connection.printed(job_id, attempt, offset, text)
