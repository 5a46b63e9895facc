"""Drainer: how a worker leaves without losing work (SIGTERM, or Drain from the control plane).

The procedure, in order:

1. tell the control plane (Draining{deadline_sec}) and take nothing new: an assignment that still
   arrives is handed back at once (outcome HANDED_BACK, which requeues it without spending an
   attempt), and so is every job still waiting locally for a runner process;
2. let running jobs finish, for up to ``deadline_sec``;
3. at the deadline kill what still runs and report it HANDED_BACK;
4. wait (at most ``ack_wait_sec``) until the control plane acknowledged every result;
5. close the stream. The agent then stops the pool and the process exits 0.
"""

from __future__ import annotations

import logging
import time

from corral.logs import WORKER_DRAINING
from worker.attempt import Outcome
from worker.connection import Connection
from worker.pool import RunnerPool

__all__ = ["Drainer"]

logger = logging.getLogger(__name__)

ACK_WAIT_SEC = 2.0
"""How long a drain waits for the last acknowledgements."""


class Drainer:
    """Runs the drain procedure over a pool and its connection."""

    def __init__(self, pool: RunnerPool, connection: Connection, ack_wait_sec: float = ACK_WAIT_SEC) -> None:
        """Bind the procedure to the pool and connection it drains."""
        self._pool = pool
        self._connection = connection
        self._ack_wait_sec = ack_wait_sec

    async def run(self, deadline_sec: float) -> None:
        """Drain: finish running jobs within ``deadline_sec``, hand back the rest, close the stream."""
        pool, connection = self._pool, self._connection
        started = time.monotonic()
        logger.info(WORKER_DRAINING, extra={"deadline_sec": deadline_sec, "running": pool.busy, "queued": pool.queued})
        connection.begin_drain(deadline_sec)
        pool.hand_back_queued()
        if not await pool.wait_idle(deadline_sec):
            killed = pool.kill_all(Outcome.HANDED_BACK)
            logger.info(WORKER_DRAINING, extra={"phase": "deadline", "handed_back": killed})
            await pool.wait_idle(pool.config.kill_grace_sec + 2.0)
        acked = await connection.wait_acked(self._ack_wait_sec)
        logger.info(
            WORKER_DRAINING,
            extra={
                "phase": "done",
                "acked": acked,
                "unacked": connection.unacked,
                "elapsed_sec": round(time.monotonic() - started, 3),
            },
        )
        await connection.close()
