"""The asyncio Python client, :class:`AsyncClient`: :class:`corral.Client`'s methods over ``grpc.aio``.

Errors are translated by the same :func:`corral.status.translate_errors` as the blocking client, so both
raise the same :mod:`corral.errors` classes. The channel is created on the first call, inside the event
loop that makes it (a ``grpc.aio`` channel belongs to one loop), so an ``AsyncClient`` may be built anywhere.

Example::

    async with corral.AsyncClient("127.0.0.1:50051") as client:
        job = await client.submit("sleep", {"seconds": 1})
        async for update in client.watch(job.id):
            print(update.state.name)
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from contextlib import aclosing
from types import TracebackType
from typing import Any

import grpc

from corral.client import (
    DEFAULT_ADDRESS,
    DEFAULT_CHANNEL_OPTIONS,
    Metadata,
    TlsCa,
    auth_metadata,
    call_timeout,
    list_request,
    ssl_credentials,
)
from corral.cluster import AutoscalerStatus, Stats, WorkerInfo
from corral.errors import CorralError, DeadlineExceeded
from corral.follow import Follow
from corral.job import Job, JobPage, JobState
from corral.spec import JobSpec, When, batch_request, by_id
from corral.status import translate_errors
from corral.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc

__all__ = ["AsyncClient"]


class AsyncClient:
    """A ``grpc.aio`` client of one control plane; use it from one event loop and ``await close()`` it.

    Args:
        address: ``host:port`` of the control plane's gRPC server.
        timeout: Deadline in seconds of each unary call (``None``: no deadline). Streams have none.
        metadata: Sent with every call.
        options: Extra gRPC channel options.
        token: A client token, sent as ``authorization: Bearer <token>`` with every call.
        tls_ca: Speak TLS and verify the control plane against this CA (PEM file path or bytes).
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
        self.timeout = call_timeout(timeout)
        self.metadata = auth_metadata(token, metadata)
        self._options = [*DEFAULT_CHANNEL_OPTIONS, *options]
        self._credentials = None if tls_ca is None else ssl_credentials(tls_ca)
        self._channel: Any = None
        self._jobs_stub: Any = None
        self._admin_stub: Any = None

    @property
    def _jobs(self) -> jobs_pb2_grpc.JobServiceAsyncStub:
        if self._jobs_stub is None:
            self._open()
        return self._jobs_stub  # type: ignore[no-any-return]

    @property
    def _admin(self) -> admin_pb2_grpc.AdminServiceAsyncStub:
        if self._admin_stub is None:
            self._open()
        return self._admin_stub  # type: ignore[no-any-return]

    def _open(self) -> None:
        if self._credentials is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=self._options)
        else:
            self._channel = grpc.aio.secure_channel(self.address, self._credentials, options=self._options)
        self._jobs_stub = jobs_pb2_grpc.JobServiceStub(self._channel)
        self._admin_stub = admin_pb2_grpc.AdminServiceStub(self._channel)

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
        ).to_proto()
        with translate_errors():
            response = await self._jobs.SubmitJob(request, timeout=self.timeout, metadata=self.metadata)
        return Job.from_proto(response.job)

    async def submit_many(self, specs: Sequence[JobSpec]) -> builtins.list[Job]:
        """Submit a batch in one ``SubmitJobs`` call; all are accepted or none is."""
        request = batch_request(specs)
        with translate_errors():
            response = await self._jobs.SubmitJobs(request, timeout=self.timeout, metadata=self.metadata)
        return [Job.from_proto(pb) for pb in response.jobs]

    async def get(self, id: str) -> Job:
        """Return the job ``id``; :class:`~corral.errors.NotFound` when there is none."""
        with translate_errors():
            pb = await self._jobs.GetJob(
                by_id(jobs_pb2.GetJobRequest, id), timeout=self.timeout, metadata=self.metadata
            )
        return Job.from_proto(pb)

    async def list(
        self,
        *,
        status: Iterable[JobState | str] = (),
        type: str = "",
        limit: int = 50,
        offset: int = 0,
        owner: str = "",
    ) -> JobPage:
        """Return a page of jobs, newest first, filtered by state(s), type and owner, with the total that
        match. (A control plane that keeps clients apart lists only the caller's jobs to all but its admins.)"""
        with translate_errors():
            response = await self._jobs.ListJobs(
                list_request(status, type, limit, offset, owner), timeout=self.timeout, metadata=self.metadata
            )
        return JobPage([Job.from_proto(pb) for pb in response.jobs], response.total)

    async def cancel(self, id: str) -> Job:
        """Cancel a job that has not finished (a running one is killed) and return it."""
        with translate_errors():
            pb = await self._jobs.CancelJob(
                by_id(jobs_pb2.CancelJobRequest, id), timeout=self.timeout, metadata=self.metadata
            )
        return Job.from_proto(pb)

    async def retry(self, id: str) -> Job:
        """Re-drive a FAILED job with a fresh attempt budget and return it."""
        with translate_errors():
            pb = await self._jobs.RetryJob(
                by_id(jobs_pb2.RetryJobRequest, id), timeout=self.timeout, metadata=self.metadata
            )
        return Job.from_proto(pb)

    def watch(self, id: str) -> AsyncGenerator[Job, None]:
        """Yield the job now and after every change; the iteration ends at a terminal state.

        A restart of the control plane does not end it (:mod:`corral.follow`). ``aclose()`` on the
        generator (or ``contextlib.aclosing``) cancels the stream.
        """
        return self._follow(Follow(id))

    async def wait(self, id: str, timeout: float | None = None) -> Job:  # noqa: ASYNC109 (same API as Client.wait)
        """Wait until the job is terminal and return it, across control-plane restarts
        (:mod:`corral.follow`); :class:`~corral.errors.DeadlineExceeded` after ``timeout``."""
        job: Job | None = None
        async with aclosing(self._follow(Follow(id, timeout))) as updates:
            async for job in updates:  # noqa: B007 (the last one is the answer)
                pass
        assert job is not None and job.is_terminal  # following ends only at a terminal state
        return job

    async def _follow(self, follow: Follow) -> AsyncGenerator[Job, None]:
        while True:
            error: CorralError | None = None
            try:
                async with aclosing(self._watch(follow.job_id, follow.remaining())) as updates:
                    async for job in updates:
                        if follow.is_new(job):
                            yield job
                        if job.is_terminal:
                            return
            except DeadlineExceeded:
                raise follow.timed_out() from None
            except CorralError as exc:
                error = exc  # pause() raises it unless the control plane went away (corral.follow)
            await asyncio.sleep(follow.pause(error))

    async def _watch(self, id: str, time_limit: float | None) -> AsyncGenerator[Job, None]:
        call = self._jobs.WatchJob(by_id(jobs_pb2.WatchJobRequest, id), timeout=time_limit, metadata=self.metadata)
        try:
            with translate_errors():
                async for event in call:
                    yield Job.from_proto(event.job)
        finally:
            call.cancel()

    # -- cluster --------------------------------------------------------------------------------------

    async def stats(self) -> Stats:
        """Return queue depth, workers, jobs by status, success rate and uptime."""
        with translate_errors():
            pb = await self._jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=self.timeout, metadata=self.metadata)
        return Stats.from_proto(pb)

    async def workers(self) -> builtins.list[WorkerInfo]:
        """Return the registered workers."""
        with translate_errors():
            response = await self._admin.ListWorkers(
                admin_pb2.ListWorkersRequest(), timeout=self.timeout, metadata=self.metadata
            )
        return [WorkerInfo.from_proto(pb) for pb in response.workers]

    async def drain_worker(self, id: str) -> WorkerInfo:
        """Stop giving the worker jobs and ask it to finish what it runs and leave."""
        with translate_errors():
            pb = await self._admin.DrainWorker(
                by_id(admin_pb2.DrainWorkerRequest, id), timeout=self.timeout, metadata=self.metadata
            )
        return WorkerInfo.from_proto(pb)

    async def autoscaler(self) -> AutoscalerStatus:
        """Return what the autoscaler is doing."""
        with translate_errors():
            pb = await self._admin.GetAutoscaler(
                admin_pb2.GetAutoscalerRequest(), timeout=self.timeout, metadata=self.metadata
            )
        return AutoscalerStatus.from_proto(pb)

    # -- lifecycle ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the channel; calls in flight are cancelled. Idempotent."""
        channel, self._channel, self._jobs_stub, self._admin_stub = self._channel, None, None, None
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient({self.address!r})"
