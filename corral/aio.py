"""The asyncio Python client, :class:`AsyncClient`: :class:`corral.Client`'s methods over ``grpc.aio``.

Errors are translated by the same :func:`corral.status.translate_errors` as the blocking client, so both
raise the same :mod:`corral.errors` classes, and a list of addresses fails over by the same rules
(:mod:`corral.failover`). An address's channel is created on the first call that goes there, inside the
event loop that makes it (a ``grpc.aio`` channel belongs to one loop), so an ``AsyncClient`` may be
built anywhere, and a standby that is never needed costs nothing.

The channels belong to the loop that opened them. A call from another loop opens new ones there once
that loop is closed (each ``asyncio.run`` closes its loop at the end) or nothing is open on it (after
:meth:`AsyncClient.close`), so one client serves one ``asyncio.run`` after another; while the old loop is
open and holds the client's channels, such a call is refused with :class:`OtherEventLoop` (two loops
at once, e.g. in two threads, need a client each).

Example::

    async with corral.AsyncClient("127.0.0.1:50051") as client:
        job = await client.submit("sleep", {"seconds": 1})
        async for update in client.watch(job.id):
            print(update.state.name)
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import aclosing, contextmanager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar, cast

import grpc

from corral.account import Account, Identity, Login, account_request
from corral.audit import AuditPage, audit_request
from corral.client import (
    DEFAULT_ADDRESS,
    DEFAULT_CHANNEL_OPTIONS,
    Metadata,
    TlsCa,
    auth_metadata,
    call_timeout,
    cancel_request,
    list_request,
    retry_request,
    ssl_credentials,
)
from corral.cluster import AutoscalerStatus, Shares, Stats, WorkerInfo
from corral.errors import ClientClosed, CorralError, DeadlineExceeded, FailedPrecondition, Unavailable
from corral.failover import NOT_SENT_PREFIX, RECONNECT_OPTIONS, Failover, client_addresses, unreached
from corral.follow import Follow, FollowMany
from corral.job import Changed, Job, JobPage, JobState, Notify
from corral.printed import OutputChunk, PrintedCursor
from corral.run_streams import AsyncRunStream, RunStreams, StaleStream
from corral.spec import JobSpec, When, batch_request, by_id
from corral.status import translate_errors
from corral.v1 import accounts_pb2, accounts_pb2_grpc, admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc

_T = TypeVar("_T")

__all__ = ["AsyncClient", "OtherEventLoop"]


class OtherEventLoop(FailedPrecondition, RuntimeError):
    """Raised when an :class:`AsyncClient` is called from an event loop other than the one its channels belong
    to while that one is still open (a RuntimeError too, as asyncio's own errors of the kind are)."""

    def __init__(self) -> None:
        super().__init__(
            "this AsyncClient's channels belong to another event loop, which is still open: a client serves one "
            "event loop at a time, and moves to a new one only once the old one is closed or the client was "
            "closed (await close()) on it; use one AsyncClient per event loop (per thread)"
        )


class _Closing:
    """What :meth:`AsyncClient.close` sets for the calls in flight: an ``asyncio.Event`` that belongs to no
    event loop (an ``asyncio.Event`` belongs to the first loop that waits on it, and a follow made before a
    client moved to a new loop waits on it there)."""

    def __init__(self) -> None:
        self._set = False
        self._waiters: set[asyncio.Future[None]] = set()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Set it and wake every waiter (those of a loop that is closed are gone with it)."""
        self._set = True
        for waiter in list(self._waiters):
            if not waiter.done() and not waiter.get_loop().is_closed():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Return once it is set."""
        if self._set:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            self._waiters.discard(waiter)


@dataclass(frozen=True)
class _Connection:
    """One address's ``grpc.aio`` channel and the stubs over it."""

    channel: grpc.aio.Channel
    jobs: jobs_pb2_grpc.JobServiceAsyncStub
    admin: admin_pb2_grpc.AdminServiceAsyncStub
    accounts: accounts_pb2_grpc.AccountServiceAsyncStub


class _WritesOrSaysUnsent:
    """A ``RunJobs`` call whose failed write is an ``Unavailable`` saying that the request was not sent.

    grpc.aio fails a write on a call that has already ended (the server ended it before the request
    could be written: a standby's immediate refusal, a control plane that stops) with ``INTERNAL:
    Internal error from Core``, or ``asyncio.InvalidStateError``, in place of the call's own status.
    The message never left (gRPC refused to send it), so the run may go to the next address
    (:data:`corral.failover.NOT_SENT_PREFIX`): without this an AsyncClient listing a standby first had
    about one ``run`` in 15 fail ``Internal`` at the standby (found by the failover soak)."""

    def __init__(self, call: Any) -> None:
        self._call = call

    @classmethod
    def opener(cls, rpc: Any) -> Callable[..., _WritesOrSaysUnsent]:
        """``rpc`` (a stream-stream method), its calls wrapped."""
        return lambda *args, **kwargs: cls(rpc(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    async def write(self, message: Any) -> None:
        """Write ``message``.

        Raises:
            Unavailable: the call had ended, so ``message`` was not sent (its message begins with
                :data:`~corral.failover.NOT_SENT_PREFIX`).
        """
        try:
            await self._call.write(message)
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            raise Unavailable(
                f"{NOT_SENT_PREFIX}the control plane ended the RunJobs stream before its request was written ({detail})"
            ) from None


class AsyncClient:
    """A ``grpc.aio`` client of a control plane; use it from one event loop at a time and ``await close()`` it.

    It may be made outside any loop; its channels are opened on the loop that first calls, and opened
    again on another loop once that one is closed (see the module docstring).

    Args:
        address: ``host:port`` of the control plane's gRPC server, or a comma-separated list of up
            to 16 (a control plane and its standbys), which the client fails over between, as
            :class:`corral.Client` does (:mod:`corral.failover`).
        timeout: Deadline in seconds of each unary call (``None``: no deadline). Streams have none.
        metadata: Sent with every call.
        options: Extra gRPC channel options.
        token: A client token, sent as ``authorization: Bearer <token>`` with every call.
        tls_ca: Speak TLS and verify the control plane against this CA (PEM file path or bytes).

    Raises:
        InvalidArgument: a bad address list or ``timeout``, as :class:`corral.Client`.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        timeout: float | None = 30,
        metadata: Metadata = (),
        options: Sequence[tuple[str, Any]] = (),
        token: str | None = None,
        tls_ca: TlsCa | None = None,
    ) -> None:
        self.address = address
        """The ``address`` argument as given: one address, or the whole list (see :attr:`addresses`)."""
        self.addresses = client_addresses(address)
        """The addresses, in order (one for a single address)."""
        self.timeout = call_timeout(timeout)
        self.metadata = auth_metadata(token, metadata)
        reconnect = RECONNECT_OPTIONS if len(self.addresses) > 1 else ()
        self._options = [*DEFAULT_CHANNEL_OPTIONS, *reconnect, *options]
        self._credentials = None if tls_ca is None else ssl_credentials(tls_ca)
        self._failover = Failover(self.addresses, self._connect)
        self._runs: RunStreams[AsyncRunStream] = RunStreams()
        self._closing = _Closing()
        """As corral.Client's: set by :meth:`close`, then replaced."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop the channels (and the kept RunJobs streams) belong to; None before the first call."""
        self._loop_end: AsyncGenerator[None, None] | None = None
        """:meth:`_at_loop_end` of :attr:`_loop`."""

    @property
    def current_address(self) -> str:
        """The address the next call goes to first: the one that took the last call (the first at the start)."""
        return self._failover.current

    def _on_this_loop(self) -> None:
        """Make the running loop the one the channels belong to: the first call's, or a new one once the
        old one is closed, or nothing is open on it (the client was closed there, or never connected).

        Raises:
            OtherEventLoop: the old loop is open and holds the client's channels.
        """
        loop = asyncio.get_running_loop()
        old = self._loop
        if loop is old:
            return
        if old is not None and not old.is_closed():
            if self._failover.connections():
                raise OtherEventLoop()
            self._runs.close()  # none, unless a run gave one back after close(): its call ends
        # What a closed loop held can be neither used nor closed from this one: forget it (gRPC closes a
        # channel that is garbage). It is closed at the loop's end, unless the loop was closed without
        # shutdown_asyncgens() (not by asyncio.run or asyncio.Runner).
        self._failover.take_connections()
        self._runs = RunStreams()
        self._loop = loop
        self._loop_end = self._at_loop_end(loop)
        with suppress(StopIteration):  # it runs to its yield at once (and the loop now knows of it)
            self._loop_end.asend(None).send(None)

    async def _at_loop_end(self, loop: asyncio.AbstractEventLoop) -> AsyncGenerator[None, None]:
        """Wait at its ``yield`` for as long as ``loop`` runs. ``loop.shutdown_asyncgens()``, which
        ``asyncio.run`` and ``asyncio.Runner`` call before they close the loop, closes it, and it closes the
        channels and kept RunJobs streams with it while the loop can still end their calls: once the loop
        is closed they can be neither used nor closed, and gRPC's events for a kept stream's call would
        be raised in the next loop. The client is not closed: its next call opens new channels."""
        try:
            yield
        finally:
            if self._loop is loop:
                self._loop = None
                self._runs.close()
                for conn in self._failover.take_connections():
                    await conn.channel.close()

    def _connect(self, target: str) -> _Connection:
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(target, options=self._options)
        else:
            channel = grpc.aio.secure_channel(target, self._credentials, options=self._options)
        # The stubs' overloads pick the async ones for a grpc.aio channel, which mypy cannot see (grpc is untyped).
        jobs = cast("jobs_pb2_grpc.JobServiceAsyncStub", jobs_pb2_grpc.JobServiceStub(channel))
        admin = cast("admin_pb2_grpc.AdminServiceAsyncStub", admin_pb2_grpc.AdminServiceStub(channel))
        accounts = cast("accounts_pb2_grpc.AccountServiceAsyncStub", accounts_pb2_grpc.AccountServiceStub(channel))
        return _Connection(channel, jobs, admin, accounts)

    async def _unary(self, rpc: Callable[[_Connection], Any], request: Any) -> Any:
        """The answer of ``rpc(connection)(request)``, sent to the current address and on round the
        list while the failure allows (corral.failover)."""
        self._on_this_loop()
        closed = self._closing
        attempts = self._failover.attempts()
        for address, conn in attempts:
            try:
                with translate_errors(), _cut_by_close(closed):
                    response = await rpc(conn)(request, timeout=self.timeout, metadata=self.metadata)
            except CorralError as exc:
                if closed.is_set():
                    raise ClientClosed() from exc
                attempts.failed(address, unreached(exc, address, _connected(conn.channel)))
                continue
            attempts.took(address)
            return response
        raise attempts.exhausted()

    # -- jobs -----------------------------------------------------------------------------------------

    async def submit(
        self,
        type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        name: str = "",
        priority: int = 0,
        thread_demand: int | None = None,
        timeout_sec: float | None = None,
        max_attempts: int | None = None,
        scheduled_at: When | None = None,
        idempotency_key: str = "",
        labels: Mapping[str, str] | None = None,
        worker_selector: Mapping[str, str] | None = None,
        depends_on: Sequence[str] = (),
        gpu_count: int = 0,
        memory_mb: int = 0,
        notify: Sequence[Notify] = (),
        start_when: str = "ALL_SUCCEEDED",
    ) -> Job:
        """Submit one job and return it as stored (see :meth:`corral.Client.submit`)."""
        request = JobSpec(
            type=type,
            payload=payload,
            name=name,
            priority=priority,
            thread_demand=thread_demand,
            timeout_sec=timeout_sec,
            max_attempts=max_attempts,
            scheduled_at=scheduled_at,
            idempotency_key=idempotency_key,
            labels=labels,
            worker_selector=worker_selector,
            depends_on=depends_on,
            gpu_count=gpu_count,
            memory_mb=memory_mb,
            notify=notify,
            start_when=start_when,
        ).to_proto()
        response = await self._unary(lambda c: c.jobs.SubmitJob, request)
        return Job.from_proto(response.job)

    async def submit_many(self, specs: Sequence[JobSpec]) -> builtins.list[Job]:
        """Submit a batch in one ``SubmitJobs`` call; all are accepted or none is."""
        request = batch_request(specs)
        response = await self._unary(lambda c: c.jobs.SubmitJobs, request)
        return [Job.from_proto(pb) for pb in response.jobs]

    async def get(self, id: str) -> Job:
        """Return the job ``id``; :class:`~corral.errors.NotFound` when there is none."""
        pb = await self._unary(lambda c: c.jobs.GetJob, by_id(jobs_pb2.GetJobRequest, id))
        return Job.from_proto(pb)

    async def list(
        self,
        *,
        status: Iterable[JobState | str] = (),
        type: str = "",
        limit: int = 50,
        offset: int = 0,
        owner: str = "",
        labels: Mapping[str, str] | None = None,
        error_code: str = "",
    ) -> JobPage:
        """Return a page of jobs, newest first, filtered as :meth:`corral.Client.list` filters them, with
        the total that match."""
        request = list_request(status, type, limit, offset, owner, labels=labels, error_code=error_code)
        response = await self._unary(lambda c: c.jobs.ListJobs, request)
        return JobPage([Job.from_proto(pb) for pb in response.jobs], response.total)

    async def queue(
        self,
        *,
        type: str = "",
        limit: int = 50,
        offset: int = 0,
        owner: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> JobPage:
        """Return a page of the queue (see :meth:`corral.Client.queue`)."""
        request = list_request((), type, limit, offset, owner, queue=True, labels=labels)
        response = await self._unary(lambda c: c.jobs.ListJobs, request)
        return JobPage([Job.from_proto(pb) for pb in response.jobs], response.total)

    async def cancel(self, id: str) -> Job:
        """Cancel a job that has not finished (a running one is killed) and return it."""
        pb = await self._unary(lambda c: c.jobs.CancelJob, by_id(jobs_pb2.CancelJobRequest, id))
        return Job.from_proto(pb)

    async def cancel_many(
        self,
        ids: Iterable[str] | None = None,
        *,
        status: Iterable[JobState | str] = (),
        type: str = "",
        owner: str = "",
        labels: Mapping[str, str] | None = None,
        all: bool = False,
        limit: int = 0,
    ) -> Changed:
        """Cancel the unfinished jobs that match every filter given, in one call; see
        :meth:`corral.Client.cancel_many`."""
        request = cancel_request(ids, status, type, owner, labels, all, limit)
        response = await self._unary(lambda c: c.jobs.CancelJobs, request)
        return Changed(list(response.ids), response.remaining)

    async def retry(self, id: str) -> Job:
        """Re-drive a FAILED job with a fresh attempt budget and return it."""
        pb = await self._unary(lambda c: c.jobs.RetryJob, by_id(jobs_pb2.RetryJobRequest, id))
        return Job.from_proto(pb)

    async def retry_many(
        self,
        ids: Iterable[str] | None = None,
        *,
        type: str = "",
        owner: str = "",
        labels: Mapping[str, str] | None = None,
        all: bool = False,
        limit: int = 0,
        error_code: str = "",
    ) -> Changed:
        """Re-drive the FAILED jobs that match every filter given, in one call; see
        :meth:`corral.Client.retry_many`."""
        request = retry_request(ids, type, owner, labels, all, limit, error_code)
        response = await self._unary(lambda c: c.jobs.RetryJobs, request)
        return Changed(list(response.ids), response.remaining)

    def watch(self, id: str) -> AsyncGenerator[Job, None]:
        """Yield the job now and after every change; the iteration ends at a terminal state.

        A restart of the control plane does not end it (:mod:`corral.follow`). ``aclose()`` on the
        generator (or ``contextlib.aclosing``) cancels the stream.
        """
        return self._follow(Follow(id, address=self.address), self._closing)

    async def watch_output(self, id: str) -> AsyncGenerator[OutputChunk, None]:
        """Yield what the job prints, as it prints it, until the job ends; see
        :meth:`corral.Client.watch_output`. ``aclose()`` on the generator cancels the stream."""
        follow = Follow(id)
        cursor = PrintedCursor()
        request = by_id(jobs_pb2.WatchOutputRequest, id)

        def start(address: str, conn: _Connection) -> tuple[AsyncGenerator[OutputChunk, None], Callable[[], None]]:
            call = conn.jobs.WatchOutput(request, metadata=self.metadata)
            return (OutputChunk(c.attempt, c.offset, c.text) async for c in call), call.cancel

        closed = self._closing
        while True:
            try:
                async with aclosing(self._served(start, closed)) as chunks:
                    async for chunk in chunks:
                        follow.reached()
                        if (fresh := cursor.take(chunk)) is not None:
                            yield fresh.chunk
                return  # the stream ends once the job has ended
            except CorralError as exc:
                await _pause(closed, follow.pause(exc))  # raises it unless the control plane went away

    async def wait(self, id: str, timeout: float | None = None) -> Job:  # noqa: ASYNC109 (same API as Client.wait)
        """Wait until the job is terminal and return it, across control-plane restarts
        (:mod:`corral.follow`); :class:`~corral.errors.DeadlineExceeded` after ``timeout`` seconds
        (``timeout=0`` looks once: the job if it has ended, else DeadlineExceeded)."""
        return await _last(self._follow(Follow(id, timeout, address=self.address), self._closing))

    def watch_many(
        self, ids: Iterable[str], *, ends_only: bool = False, timeout: float | None = None
    ) -> AsyncGenerator[Job, None]:
        """Yield each job now, then after every change, until every one has ended, on one ``WatchJobs``
        stream; see :meth:`corral.Client.watch_many`. ``aclose()`` on the generator cancels the stream."""
        return self._follow_many(FollowMany(ids, timeout, ends_only, address=self.address))

    async def wait_all(self, ids: Iterable[str], timeout: float | None = None) -> builtins.list[Job]:  # noqa: ASYNC109 (same API as Client.wait_all)
        """Wait until every job has ended and return them terminal, in the order of ``ids``; see
        :meth:`corral.Client.wait_all`."""
        follow = FollowMany(ids, timeout, ends_only=True, address=self.address)
        async for _ in self._follow_many(follow):
            pass
        return follow.ends()

    async def _follow_many(self, follow: FollowMany) -> AsyncGenerator[Job, None]:
        closed = self._closing
        while not follow.done:
            error: CorralError | None = None
            limit = follow.opening()  # before request(): a check asks for more than the ends
            updates = self._stream(lambda c: c.jobs.WatchJobs, follow.request(), limit, closed)
            try:
                async with aclosing(updates):
                    async for job in updates:
                        if follow.is_new(job):
                            yield job
                        if follow.checked:
                            break  # timeout=0 looked once: pause() raises DeadlineExceeded for the rest
            except DeadlineExceeded:  # on a connection (_served): the control plane took the stream
                follow.reached()
                raise follow.timed_out() from None
            except CorralError as exc:
                error = exc  # pause() raises it unless the control plane went away (corral.follow)
            if not follow.done:
                await _pause(closed, follow.pause(error))

    async def run(
        self,
        type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (same API as Client.run)
        **fields: Any,
    ) -> Job:
        """Submit one job and wait until it ends, on a kept ``RunJobs`` stream (with a ``timeout``, in one
        ``RunJob`` call); see :meth:`corral.Client.run`."""
        return await _last(self.submit_and_watch(type, payload, timeout=timeout, **fields))

    def submit_and_watch(
        self, type: str, payload: Mapping[str, Any] | None = None, *, timeout: float | None = None, **fields: Any
    ) -> AsyncGenerator[Job, None]:
        """What :meth:`run` does, yielding the job as accepted and after every change; see
        :meth:`corral.Client.submit_and_watch`."""
        request = JobSpec(type=type, payload=payload, **fields).to_proto()
        follow = Follow("", timeout, address=self.address)
        closed = self._closing
        if timeout is None:
            return self._follow(follow, closed, lambda: self._run_on_stream(request, closed))
        return self._follow(
            follow, closed, lambda: self._stream(lambda c: c.jobs.RunJob, request, follow.remaining(), closed)
        )

    async def _follow(
        self,
        follow: Follow,
        closed: _Closing,
        submit: Callable[[], AsyncGenerator[Job, None]] | None = None,
    ) -> AsyncGenerator[Job, None]:
        """Follow ``follow.job_id`` to its end; with ``submit``, first the stream that submits it (see
        corral.Client._follow, and for ``closed``)."""
        while True:
            error: CorralError | None = None
            if submit is not None:
                updates = submit()
            else:
                watch = by_id(jobs_pb2.WatchJobRequest, follow.job_id)
                updates = self._stream(lambda c: c.jobs.WatchJob, watch, follow.opening(), closed)
            try:
                async with aclosing(updates):
                    async for job in updates:
                        follow.job_id = job.id
                        if follow.is_new(job):
                            yield job
                        if job.is_terminal:
                            return
                        if follow.checked:
                            break  # timeout=0 looked once: pause() raises DeadlineExceeded
            except DeadlineExceeded:  # on a connection (_served): the control plane took the stream
                follow.reached()
                raise follow.timed_out() from None
            except CorralError as exc:
                error = exc  # pause() raises it unless the control plane went away (corral.follow)
            pause = follow.after_run(error) if submit is not None else follow.pause(error)
            submit = None  # never sent twice: from here the job is watched
            await _pause(closed, pause)

    def _run_on_stream(self, request: jobs_pb2.SubmitJobRequest, closed: _Closing) -> AsyncGenerator[Job, None]:
        """As corral.Client._run_on_stream; a kept stream found ended when written to (its end not read
        yet by this event loop) is replaced by a fresh one, since nothing was sent on it."""

        async def run(address: str, conn: _Connection) -> AsyncGenerator[Job, None]:
            make = functools.partial(
                AsyncRunStream, address, _WritesOrSaysUnsent.opener(conn.jobs.RunJobs), self.metadata
            )
            stream = self._runs.borrow(address, make)
            try:
                while True:  # at most twice: a fresh stream is never stale
                    try:
                        async for job in stream.run(request):
                            yield job
                        return
                    except StaleStream:
                        stream.close()
                        stream = make()
            finally:
                self._runs.give_back(stream)

        return self._served(lambda address, conn: (run(address, conn), lambda: None), closed)

    def _stream(
        self, rpc: Callable[[_Connection], Any], request: Any, time_limit: float | None, closed: _Closing
    ) -> AsyncGenerator[Job, None]:
        """As corral.Client._stream."""

        def start(address: str, conn: _Connection) -> tuple[AsyncGenerator[Job, None], Callable[[], None]]:
            call = rpc(conn)(request, timeout=time_limit, metadata=self.metadata)
            return (Job.from_proto(event.job) async for event in call), call.cancel

        return self._served(start, closed)

    async def _served(
        self,
        start: Callable[[str, _Connection], tuple[AsyncGenerator[_T, None], Callable[[], None]]],
        closed: _Closing,
    ) -> AsyncGenerator[_T, None]:
        """As corral.Client._served (a call that close() cut ends ClientClosed, not the bare
        ``asyncio.CancelledError`` grpc.aio raises in a task that nobody cancelled)."""
        self._on_this_loop()
        attempts = self._failover.attempts()
        for address, conn in attempts:
            if closed.is_set():
                raise ClientClosed()
            jobs, end = start(address, conn)
            served = False
            try:
                with translate_errors(), _cut_by_close(closed):
                    async with aclosing(jobs):
                        async for job in jobs:
                            if not served:
                                served = True
                                attempts.took(address)
                            yield job
            except CorralError as exc:
                if closed.is_set():
                    raise ClientClosed() from exc
                exc = unreached(exc, address, _connected(conn.channel))
                if served:
                    raise exc from None
                attempts.failed(address, exc)
                continue
            finally:
                end()
            attempts.took(address)
            return
        raise attempts.exhausted()

    # -- cluster --------------------------------------------------------------------------------------

    async def stats(self) -> Stats:
        """Return queue depth, workers, jobs by status, success rate and uptime."""
        pb = await self._unary(lambda c: c.jobs.GetStats, jobs_pb2.GetStatsRequest())
        return Stats.from_proto(pb)

    async def workers(self) -> builtins.list[WorkerInfo]:
        """Return the registered workers."""
        response = await self._unary(lambda c: c.admin.ListWorkers, admin_pb2.ListWorkersRequest())
        return [WorkerInfo.from_proto(pb) for pb in response.workers]

    async def drain_worker(self, id: str) -> WorkerInfo:
        """Stop giving the worker jobs and ask it to finish what it runs and leave."""
        pb = await self._unary(lambda c: c.admin.DrainWorker, by_id(admin_pb2.DrainWorkerRequest, id))
        return WorkerInfo.from_proto(pb)

    async def autoscaler(self) -> AutoscalerStatus:
        """Return what the autoscaler is doing."""
        pb = await self._unary(lambda c: c.admin.GetAutoscaler, admin_pb2.GetAutoscalerRequest())
        return AutoscalerStatus.from_proto(pb)

    async def shares(self) -> Shares:
        """Each share of the cluster (a group, or an owner in none), lowest fair-share rank first:
        what it holds and queues now, and the thread- and GPU-seconds it used (admins only)."""
        pb = await self._unary(lambda c: c.admin.ListShares, admin_pb2.ListSharesRequest())
        return Shares.from_proto(pb)

    async def audit(
        self,
        *,
        actor: str = "",
        action: str = "",
        target: str = "",
        outcome: str = "",
        limit: int = 100,
        offset: int = 0,
    ) -> AuditPage:
        """As :meth:`corral.Client.audit`."""
        request = audit_request(actor, action, target, outcome, limit, offset)
        return AuditPage.from_proto(await self._unary(lambda c: c.admin.ListAuditEvents, request))

    # -- accounts -------------------------------------------------------------------------------------

    async def register(self, name: str, password: str) -> Account:
        """Create the account ``name`` with ``password`` and return it (see :meth:`corral.Client.register`)."""
        request = account_request(accounts_pb2.RegisterRequest, name=name, password=password)
        return Account.from_proto(await self._unary(lambda c: c.accounts.Register, request))

    async def login(self, name: str, password: str) -> Login:
        """Log in to the account ``name``; the answer's token works as a client's ``token`` until it expires
        (see :meth:`corral.Client.login`)."""
        request = account_request(accounts_pb2.LoginRequest, name=name, password=password)
        return Login.from_proto(await self._unary(lambda c: c.accounts.Login, request))

    async def whoami(self) -> Identity:
        """Return who the control plane takes this client for (see :meth:`corral.Client.whoami`)."""
        pb = await self._unary(lambda c: c.accounts.WhoAmI, accounts_pb2.WhoAmIRequest())
        return Identity.from_proto(pb)

    async def accounts(self) -> builtins.list[Account]:
        """Return every account; admins only (:class:`~corral.errors.PermissionDenied` otherwise)."""
        response = await self._unary(lambda c: c.accounts.ListAccounts, accounts_pb2.ListAccountsRequest())
        return [Account.from_proto(pb) for pb in response.accounts]

    async def set_password(self, name: str, password: str, *, current_password: str = "") -> Account:
        """Set the password of the account ``name`` and return the account; every earlier login of it ends
        (see :meth:`corral.Client.set_password`)."""
        request = account_request(
            accounts_pb2.SetPasswordRequest, name=name, password=password, current_password=current_password
        )
        return Account.from_proto(await self._unary(lambda c: c.accounts.SetPassword, request))

    async def delete_account(self, name: str) -> None:
        """Delete the account ``name`` and end its logins; its jobs stay (see :meth:`corral.Client.delete_account`)."""
        request = account_request(accounts_pb2.DeleteAccountRequest, name=name)
        await self._unary(lambda c: c.accounts.DeleteAccount, request)

    async def end_all_logins(self) -> None:
        """End every login of every account at once (see :meth:`corral.Client.end_all_logins`)."""
        await self._unary(lambda c: c.accounts.EndAllLogins, accounts_pb2.EndAllLoginsRequest())

    # -- lifecycle ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the channels; calls in flight (other tasks' ``wait``, ``watch``, ``run``, unary calls) end
        at once with :class:`~corral.errors.ClientClosed`, and a follow never watches again on a new
        channel. Idempotent (a call made after it opens new channels)."""
        self._on_this_loop()  # channels of a loop that was closed are forgotten, not closed from here
        closed, self._closing = self._closing, _Closing()
        closed.set()  # first: a call that sees its channel cut then knows it was closed
        self._runs.close()
        for conn in self._failover.take_connections():
            await conn.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient({self.address!r})"


@contextmanager
def _cut_by_close(closed: _Closing) -> Iterator[None]:
    """Run the body, raising :class:`ClientClosed` for the ``asyncio.CancelledError`` that grpc.aio raises
    in a call whose channel :meth:`AsyncClient.close` closed, when the task itself is not being cancelled."""
    try:
        yield
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if closed.is_set() and task is not None and not task.cancelling():
            raise ClientClosed() from None
        raise


async def _pause(closed: _Closing, seconds: float) -> None:
    """Wait ``seconds`` before following again, or raise at once when the client is closed meanwhile.

    Raises:
        ClientClosed: ``closed`` is set.
    """
    with suppress(TimeoutError):
        await asyncio.wait_for(closed.wait(), seconds)
    if closed.is_set():
        raise ClientClosed()


def _connected(channel: grpc.aio.Channel) -> bool:
    """Whether ``channel`` has a connection to its server (READY) now."""
    return bool(channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY)


async def _last(updates: AsyncGenerator[Job, None]) -> Job:
    """The terminal job a follow ends with (the stream is closed however it ends)."""
    job: Job | None = None
    async with aclosing(updates):
        async for job in updates:  # noqa: B007 (the last one is the answer)
            pass
    assert job is not None and job.is_terminal  # following ends only at a terminal state
    return job
