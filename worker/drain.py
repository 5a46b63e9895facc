"""Drainer: how a worker leaves without losing work (SIGTERM, or Drain from the control plane).

The procedure, in order:

1. tell the control plane (Draining{deadline_sec}) and take nothing new: an assignment that still
   arrives is handed back at once (outcome HANDED_BACK, which requeues it without spending an
   attempt), and so is every job still waiting locally for a runner process;
2. let running jobs finish, for up to ``deadline_sec``;
3. at the deadline kill what still runs and report it HANDED_BACK;
4. wait until the control plane acknowledged every result: for ``ack_wait_sec``, and on until the
   drain deadline while results are left. The connection keeps reconnecting and resending them
   meanwhile, so a control plane that restarts during the drain (a rolling deploy) still gets them;
   if it does not in time, the log names the attempts left unacknowledged (the control plane counts
   them lost, WORKER_LOST: each is charged an attempt and run again while it has attempts left);
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
"""How long a drain waits for the last acknowledgements at least (longer while its deadline has not passed)."""


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
        acked = await self._wait_acked(started + deadline_sec)
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

    async def _wait_acked(self, deadline: float) -> bool:
        """Wait until every result is acknowledged: ``ack_wait_sec``, then on until ``deadline``
        (``time.monotonic()``) while some are not; False (and a warning naming them) if some never were."""
        connection = self._connection
        until = max(time.monotonic() + self._ack_wait_sec, deadline)
        if await connection.wait_acked(self._ack_wait_sec):
            return True
        # Results a control plane that is away never acknowledged (restarting, a rolling deploy): leaving
        # now would lose them, and it would run those jobs again. The connection keeps reconnecting.
        if (left := until - time.monotonic()) > 0:
            logger.info(
                WORKER_DRAINING,
                extra={
                    "phase": "awaiting_ack",
                    "unacked": connection.unacked,
                    "connected": connection.registered.is_set(),
                    "within_sec": round(left, 3),
                },
            )
            if await connection.wait_acked(left):
                return True
        logger.warning(
            WORKER_DRAINING,
            extra={
                "phase": "unacknowledged",
                "unacked": connection.unacked,
                "results": ", ".join(connection.unacked_results()),
                "consequence": "the control plane counts these attempts lost (WORKER_LOST)",
            },
        )
        return False
