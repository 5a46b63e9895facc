"""WorkerServicer.Connect: one bidirectional stream per worker.

Outgoing messages are coalesced: every assignment and every ack queued while the stream was busy
writing goes out in one message, which keeps the per-job cost of the stream low under load.

Acks are not urgent (they only let the worker forget results it keeps until then), so an ack waits up
to ACK_DELAY_SEC for an assignment or another message to ride with. Under load that is the next
assignment, a moment later; on an idle worker it keeps a write of its own off the event loop just when
the result's watchers are being told, which is what a waiting client is waiting for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from control.api import convert
from control.api.status import Undecodable, rich_status
from control.registry import Assignment, AttemptKey
from control.sessions import WorkerSessions
from corral import logs
from corral.errors import CorralError, InvalidArgument
from corral.v1 import workers_pb2

logger = logging.getLogger(__name__)

ACK_DELAY_SEC = 0.005
"""Longest an ack waits for an assignment to share a message with (see the module docstring)."""


class GrpcLink:
    """The WorkerLink of one stream: queues messages for the writer loop."""

    def __init__(self) -> None:
        self._assign: list[Assignment] = []
        self._acks: list[AttemptKey] = []
        self._other: list[workers_pb2.ControlMessage] = []
        self._wake = asyncio.Event()
        self._ack_timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.refused: CorralError | None = None
        """Why the worker's side of the stream was refused (a message that did not decode), if it was."""

    def assign(self, assignments: list[Assignment]) -> None:
        """Queue assignments; they go out at once, in one message with any acks queued."""
        self._assign.extend(assignments)
        self._wake.set()

    def ack(self, attempts: list[AttemptKey]) -> None:
        """Queue acknowledgements; they wait up to ACK_DELAY_SEC for another message to ride with."""
        self._acks.extend(attempts)
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY_SEC, self._wake.set)

    def cancel(self, job_id: str, attempt: int) -> None:
        """Queue a Cancel of attempt ``attempt`` of ``job_id``, sent as a message of its own."""
        msg = workers_pb2.ControlMessage()
        msg.cancel.attempt.job_id = job_id
        msg.cancel.attempt.attempt = attempt
        self._other.append(msg)
        self._wake.set()

    def drain(self, deadline_sec: float) -> None:
        """Queue a Drain asking the worker to finish within ``deadline_sec`` and leave."""
        msg = workers_pb2.ControlMessage()
        msg.drain.deadline_sec = deadline_sec
        self._other.append(msg)
        self._wake.set()

    def close(self) -> None:
        """Stop the ack timer and end :meth:`outgoing` at its next wake-up, dropping what is queued then."""
        self.closed = True
        self._cancel_ack_timer()
        self._wake.set()

    def _cancel_ack_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None

    async def outgoing(self) -> AsyncIterator[workers_pb2.ControlMessage]:
        """Messages to write, coalesced, until the link is closed."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.closed:
                return
            # Assignments first: a Cancel queued meanwhile may be for one of them, and a worker drops a
            # Cancel of an attempt it has not been given, then would run it to its end.
            if self._assign or self._acks:
                msg = workers_pb2.ControlMessage()
                if self._assign:
                    convert.add_assignments(msg.assign, self._assign)
                    self._assign = []
                if self._acks:
                    convert.add_attempt_refs(msg.ack.attempts, self._acks)
                    self._acks = []
                    self._cancel_ack_timer()
                yield msg
            if self._other:
                other, self._other = self._other, []
                for msg in other:
                    yield msg


class WorkerServicer:
    """corral.v1.WorkerService."""

    def __init__(self, sessions: WorkerSessions) -> None:
        self.sessions = sessions

    async def Connect(
        self, request_iterator: AsyncIterator[workers_pb2.WorkerMessage], context: grpc.aio.ServicerContext
    ) -> None:
        """One worker's stream: Register first (INVALID_ARGUMENT otherwise; ALREADY_EXISTS for an id another connected
        process holds), answered with Registered; then the link's messages go out while a reader task applies results,
        output, heartbeats and draining, until either side ends the stream."""
        try:
            first = await anext(request_iterator)
            if isinstance(first, Undecodable):
                raise InvalidArgument(first.field, first.reason)
            if first.WhichOneof("msg") != "register":
                raise InvalidArgument("register", "the first message on a worker stream must be Register")
            hello = convert.hello(first.register)
            link = GrpcLink()
            adopted, rejected = self.sessions.register(hello, link)
        except StopAsyncIteration:
            return
        except CorralError as err:
            code, message, trailers = rich_status(err)
            await context.abort(code, message, trailing_metadata=trailers)
        s = self.sessions.s
        reply = workers_pb2.ControlMessage()
        reply.registered.worker_id = hello.worker_id
        reply.registered.heartbeat_interval_sec = s.config.heartbeat_interval_sec
        reply.registered.heartbeat_timeout_sec = s.config.heartbeat_timeout_sec
        reply.registered.registered_at = s.clock.now()  # before any lease to it: nothing awaited since
        reply.registered.adopted.extend(convert.attempt_refs(adopted))
        reply.registered.rejected.extend(convert.attempt_refs(rejected))
        reader = asyncio.ensure_future(self._read(hello.worker_id, request_iterator, link))
        try:
            await context.write(reply)
            async for msg in link.outgoing():
                await context.write(msg)
        finally:
            reader.cancel()
            self.sessions.disconnected(hello.worker_id, link)
        if link.refused is not None:
            code, message, trailers = rich_status(link.refused)
            await context.abort(code, message, trailing_metadata=trailers)

    async def _read(self, worker_id: str, requests: AsyncIterator[workers_pb2.WorkerMessage], link: GrpcLink) -> None:
        sessions = self.sessions
        try:
            async for msg in requests:
                if isinstance(msg, Undecodable):
                    link.refused = InvalidArgument(msg.field, msg.reason)
                    logger.warning(
                        logs.WORKER_MESSAGE_REFUSED,
                        extra={"worker_id": worker_id, "field": msg.field, "reason": msg.reason},
                    )
                    return
                kind = msg.WhichOneof("msg")
                if kind == "results":
                    sessions.results(worker_id, convert.reports(msg.results), link)
                elif kind == "output":
                    out = msg.output
                    sessions.printed(worker_id, out.attempt.job_id, out.attempt.attempt, out.offset, out.text)
                elif kind == "heartbeat":
                    sessions.heard_from(worker_id)
                    logger.debug(logs.WORKER_HEARTBEAT, extra={"worker_id": worker_id})
                elif kind == "draining":
                    sessions.draining(worker_id)
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        except Exception:
            logger.exception("worker_stream_failed", extra={"worker_id": worker_id})
        finally:
            link.close()
