"""RunJobs: RunJob for many jobs on one stream that stays open (the servicer's side of one stream).

A reader task takes the caller's requests in order. Each accepted tag gets a task of its own that
submits the job (everything a SubmitJob does applies) and forwards the job's events
(``JobFeeds.watch``) to the stream's one outbox, tagged; so jobs run at once and their events
interleave, while one tag's events keep their order. A submission that is refused is answered with
one tagged error (the ``google.rpc.Status`` SubmitJob would have ended with), and the tag is free
again: the stream goes on.

A request counts as unanswered until its last answer (its job's terminal event, or its refusal) has
been handed to gRPC. While :data:`MAX_UNANSWERED` are, the reader takes no more: a caller that sends
faster than it reads is held back by the stream's flow control, and the answers waiting here stay
bounded, whatever it sends.

The stream ends:

* OK, once the caller has sent its last request (half-closed) and every request has its last answer;
* UNAVAILABLE when the control plane stops (:meth:`control.watch.Watchers.on_close`), idle or not,
  so that a stream never holds a stop: a client re-watches the jobs it had been told of;
* with the error, when a request cannot be read at all (its tag is unknown, so nothing else can
  name it) or a job's events cannot be followed after it was accepted.

A caller that goes away ends the stream's tasks; the jobs it submitted go on, as after a RunJob.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from control.api import convert
from control.api.status import Undecodable, status_of
from control.jobs import JobRecord
from control.scheduler import Scheduler
from control.watch import SHUTTING_DOWN
from corral.errors import CorralError, InvalidArgument, Unavailable
from corral.v1 import jobs_pb2

__all__ = ["MAX_TAG", "MAX_UNANSWERED", "RunJobsStream"]

MAX_TAG = 64
"""Longest tag, in characters."""
MAX_UNANSWERED = 1000
"""Most requests of one stream without their last answer sent; the stream reads no more until fewer."""

Submit = Callable[[jobs_pb2.SubmitJobRequest], Awaitable[JobRecord]]
_Item = tuple[jobs_pb2.RunJobsEvent, bool] | BaseException | None
"""What the outbox holds: an answer and whether it is its request's last; an error that ends the
stream; None, the stream is done."""


class RunJobsStream:
    """One RunJobs stream: :meth:`events` yields what the caller is sent."""

    def __init__(self, scheduler: Scheduler, submit: Submit) -> None:
        self.s = scheduler
        self._submit = submit
        self._outbox: asyncio.Queue[_Item] = asyncio.Queue()
        self._running: dict[str, asyncio.Task[None]] = {}
        """Tags whose job is being submitted or followed (a tag in use cannot be sent again)."""
        self._unanswered = 0
        self._room = asyncio.Event()
        self._read_all = False

    async def events(self, requests: AsyncIterator[jobs_pb2.RunJobsRequest]) -> AsyncIterator[jobs_pb2.RunJobsEvent]:
        """The tagged events and refusals, until the stream ends (see the module docstring).

        Raises:
            Unavailable: the control plane is stopping.
            InvalidArgument: a request could not be read.
        """
        stop = self.s.watchers.on_close(lambda: self._outbox.put_nowait(Unavailable(SHUTTING_DOWN)))
        reader = asyncio.ensure_future(self._read(requests))
        try:
            while True:
                item = await self._outbox.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                event, last = item
                yield event
                if last:
                    self._unanswered -= 1
                    self._room.set()
                    self._check_done()
        finally:
            stop()
            reader.cancel()
            for task in self._running.values():
                task.cancel()

    async def _read(self, requests: AsyncIterator[jobs_pb2.RunJobsRequest | Undecodable]) -> None:
        try:
            async for request in requests:
                if isinstance(request, Undecodable):
                    raise InvalidArgument(request.field, request.reason)
                while self._unanswered >= MAX_UNANSWERED:
                    self._room.clear()
                    await self._room.wait()
                self._unanswered += 1
                self._take(request)
        except CorralError as exc:
            self._outbox.put_nowait(exc)
            return
        self._read_all = True
        self._check_done()

    def _take(self, request: jobs_pb2.RunJobsRequest) -> None:
        tag = request.tag
        if not 1 <= len(tag) <= MAX_TAG:
            self._refuse(tag, InvalidArgument("tag", f"must be 1 to {MAX_TAG} characters, got {len(tag)}"))
        elif tag in self._running:
            self._refuse(tag, InvalidArgument("tag", f"{tag!r} names a job of this stream that has not ended"))
        else:
            self._running[tag] = asyncio.ensure_future(self._run(tag, request.job))

    def _refuse(self, tag: str, error: CorralError) -> None:
        self._outbox.put_nowait((jobs_pb2.RunJobsEvent(tag=tag, error=status_of(error)), True))

    async def _run(self, tag: str, request: jobs_pb2.SubmitJobRequest) -> None:
        try:
            try:
                accepted = await self._submit(request)
            except InvalidArgument as exc:  # fields are named from the RunJobsRequest
                self._refuse(tag, InvalidArgument(f"job.{exc.field}", exc.rule))
                return
            except CorralError as exc:
                self._refuse(tag, exc)
                return
            # JobFeeds.watch subscribes before it reads the job: no change after the commit goes unheard.
            async for job in self.s.feeds.watch(accepted.id, budgeted=False):
                event = jobs_pb2.RunJobsEvent(tag=tag, event=jobs_pb2.JobEvent(job=convert.job(job)))
                self._outbox.put_nowait((event, job.state.terminal))
        except Exception as exc:  # the job was accepted but cannot be followed: end the stream with why
            self._outbox.put_nowait(exc)
        finally:
            del self._running[tag]

    def _check_done(self) -> None:
        if self._read_all and not self._unanswered:
            self._outbox.put_nowait(None)
