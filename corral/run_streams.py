"""Open ``RunJobs`` streams that a client keeps and reuses, so that ``run`` pays for opening a call once.

A ``run`` (``Client.run``, ``AsyncClient.run`` and their ``submit_and_watch``) borrows a stream to the
address the call goes to, sends its one tagged request on it and reads until its job's terminal event,
then gives the stream back for the next ``run``. A stream is lent to one run at a time, so that no run
reads another's events: a client used from several threads (or tasks) at once opens a stream for each
run in progress, and keeps up to :data:`KEEP_IDLE` of them open between runs.

A stream is given back only when its run ended cleanly: at its terminal event, or refused (the
submission's error, answered in the stream, which goes on). A run that is left early (its generator
closed) or broken closes its stream; the next run opens a fresh one. A stream that ended while idle (a
control plane that restarted) is never lent again. What happens to a run whose stream breaks is the
client's rule for RunJob (``corral.follow``): raised before the job was accepted, followed after.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

import grpc

from corral.errors import InvalidArgument, Unavailable
from corral.job import Job
from corral.status import error_from_status
from corral.v1 import jobs_pb2

__all__ = ["KEEP_IDLE", "AsyncRunStream", "RunStream", "RunStreams", "StaleStream"]

KEEP_IDLE = 8
"""Most streams a client keeps open between runs (per client, over all its addresses)."""

ENDED_EARLY = "the control plane ended the RunJobs stream before the job ended"


class _Stream(Protocol):
    address: str

    @property
    def idle(self) -> bool: ...

    def close(self) -> None: ...


S = TypeVar("S", bound=_Stream)


class RunStreams(Generic[S]):
    """The open streams a client keeps between runs; thread-safe."""

    def __init__(self, keep: int = KEEP_IDLE) -> None:
        self._keep = keep
        self._idle: list[S] = []
        self._lock = threading.Lock()

    def borrow(self, address: str, open_stream: Callable[[], S]) -> S:
        """An idle stream to ``address`` (the most recently used), or a new one from ``open_stream``."""
        stale: list[S] = []
        found: S | None = None
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):
                stream = self._idle[i]
                if not stream.idle:  # ended while idle
                    stale.append(self._idle.pop(i))
                elif stream.address == address:
                    found = self._idle.pop(i)
                    break
        for stream in stale:
            stream.close()
        return found if found is not None else open_stream()

    def give_back(self, stream: S) -> None:
        """Keep ``stream`` for the next run if it is idle and there is room; else close it."""
        with self._lock:
            if stream.idle and len(self._idle) < self._keep:
                self._idle.append(stream)
                return
        stream.close()

    def close(self) -> None:
        """Close every idle stream (one given back after its channel closed is not idle: it is closed)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for stream in idle:
            stream.close()


class StaleStream(Exception):
    """Raised when a kept stream turns out to have ended before a run's request could be written."""


class _OneRunAtATime:
    """What the two kinds of stream share: the call, its tags, and whether a run is in progress."""

    _call: Any

    def __init__(self, address: str) -> None:
        self.address = address
        self._next_tag = 0
        self._running = False

    @property
    def idle(self) -> bool:
        """Whether it may be lent: open, and no run in progress on it."""
        return not self._running and not self._call.done()

    def _start(self, request: jobs_pb2.SubmitJobRequest) -> jobs_pb2.RunJobsRequest:
        """The tagged request of a new run (a tag is never reused on a stream)."""
        self._next_tag += 1
        self._running = True
        return jobs_pb2.RunJobsRequest(tag=str(self._next_tag), job=request)

    def _job_of(self, tag: str, event: jobs_pb2.RunJobsEvent) -> Job | None:
        """The job an event of run ``tag`` carries; None for an event of another tag (none is expected: a
        stream whose run was left early is closed, not lent again). A refusal of the submission is
        raised, and leaves the stream idle: it goes on."""
        if event.tag != tag:
            return None
        if event.HasField("error"):
            self._running = False
            error = error_from_status(event.error)
            if isinstance(error, InvalidArgument):  # named from the RunJobsRequest; the caller's name has no "job."
                error = InvalidArgument(error.field.removeprefix("job."), error.rule)
                error.answered = True
            raise error
        job = Job.from_proto(event.event.job)
        if job.is_terminal:
            self._running = False
        return job


class RunStream(_OneRunAtATime):
    """One open RunJobs call of a blocking client (gRPC reads its requests from a queue)."""

    def __init__(self, address: str, rpc: Any, metadata: Any) -> None:
        super().__init__(address)
        self._requests: queue.SimpleQueue[jobs_pb2.RunJobsRequest | None] = queue.SimpleQueue()
        self._call = rpc(iter(self._requests.get, None), metadata=metadata)

    def run(self, request: jobs_pb2.SubmitJobRequest) -> Generator[Job, None, None]:
        """Send ``request``; yield its job as accepted and after every change, to a terminal state.

        Raises:
            CorralError: the refusal of the submission.
            grpc.RpcError: the stream failed (the caller translates it).
            Unavailable: the stream ended before the job did.
        """
        message = self._start(request)
        self._requests.put(message)
        for event in self._call:
            job = self._job_of(message.tag, event)
            if job is not None:
                yield job
                if job.is_terminal:
                    return
        raise Unavailable(ENDED_EARLY)

    def close(self) -> None:
        """End the call: stop gRPC's thread that reads its requests, then cancel it (a run on it breaks)."""
        self._requests.put(None)  # ends gRPC's thread that reads the requests
        self._call.cancel()


class AsyncRunStream(_OneRunAtATime):
    """One open RunJobs call of an asyncio client."""

    def __init__(self, address: str, rpc: Any, metadata: Any) -> None:
        super().__init__(address)
        self._call = rpc(metadata=metadata)

    async def run(self, request: jobs_pb2.SubmitJobRequest) -> AsyncGenerator[Job, None]:
        """As :meth:`RunStream.run`.

        Raises:
            StaleStream: a kept stream had ended unseen (its end not yet read by the event loop), so
                the request could not be written: it was not sent.
        """
        message = self._start(request)
        try:
            await self._call.write(message)
        except Exception as exc:  # gRPC raises several kinds, its own internal ones among them
            if self._next_tag > 1:
                raise StaleStream("a kept RunJobs stream had ended; the request was not sent") from exc
            raise
        while True:
            event = await self._call.read()
            if event is grpc.aio.EOF:
                raise Unavailable(ENDED_EARLY)
            job = self._job_of(message.tag, event)
            if job is not None:
                yield job
                if job.is_terminal:
                    return

    def close(self) -> None:
        """Cancel the call (a run on it breaks)."""
        self._call.cancel()
