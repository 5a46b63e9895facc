"""The synchronous Python client, :class:`Client`, over the ``corral.v1`` gRPC stubs.

Every call goes through :func:`corral.status.translate_errors`, so a failure is always a
:class:`corral.errors.CorralError` (never a ``grpc.RpcError``); the asyncio twin with the same methods is
:class:`corral.aio.AsyncClient`. Both build requests the same way
(:meth:`JobSpec.to_proto`, :func:`list_request`).

Example::

    with corral.Client("127.0.0.1:50051") as client:
        job = client.submit("add_numbers", {"a": 1, "b": 2})
        print(client.wait(job.id).result)  # {'sum': 3}
"""

from __future__ import annotations

import builtins
import math
import os
import time
from collections.abc import Generator, Iterable, Mapping, Sequence
from contextlib import closing
from types import TracebackType
from typing import Any

import grpc

from corral.cluster import AutoscalerStatus, Stats, WorkerInfo
from corral.errors import CorralError, DeadlineExceeded, InvalidArgument
from corral.follow import Follow
from corral.job import Job, JobPage, JobState
from corral.spec import JobSpec, When, batch_request, by_id, put
from corral.status import translate_errors
from corral.transport import keepalive
from corral.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc

KEEPALIVE_SEC = 5.0
"""While a call is open the client pings the control plane this often, and gives the connection up
when a ping is unanswered as long: a watch on a connection that went silent (a partition) fails
UNAVAILABLE within about twice this, and is watched again (corral.follow), instead of hanging for ever."""
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", 64 << 20),  # payloads and results (a binary array can be megabytes)
    *keepalive(KEEPALIVE_SEC, KEEPALIVE_SEC),
)

__all__ = [
    "DEFAULT_ADDRESS",
    "Client",
    "Metadata",
    "auth_metadata",
    "call_timeout",
    "list_request",
    "ssl_credentials",
]

DEFAULT_ADDRESS = "127.0.0.1:50051"
"""Where the control plane listens for gRPC by default."""

Metadata = Sequence[tuple[str, str]]
"""gRPC metadata sent with every call, e.g. ``[("x-request-id", "abc")]``."""

TlsCa = str | os.PathLike[str] | bytes
"""A CA for TLS: a PEM file's path, or the PEM bytes themselves."""


def auth_metadata(token: str | None, metadata: Metadata = ()) -> tuple[tuple[str, str], ...]:
    """``metadata`` plus ``authorization: Bearer <token>`` when there is a token."""
    if token:
        return (*metadata, ("authorization", f"Bearer {token}"))
    return tuple(metadata)


def ssl_credentials(tls_ca: TlsCa) -> grpc.ChannelCredentials:
    """Channel credentials that verify the control plane against ``tls_ca``."""
    if isinstance(tls_ca, bytes):
        return grpc.ssl_channel_credentials(tls_ca)
    with open(tls_ca, "rb") as f:
        return grpc.ssl_channel_credentials(f.read())


class Client:
    """A blocking client of one control plane; thread-safe, one channel, close it when done.

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
        channel_options = [*DEFAULT_CHANNEL_OPTIONS, *options]
        if tls_ca is None:
            self._channel = grpc.insecure_channel(address, options=channel_options)
        else:
            self._channel = grpc.secure_channel(address, ssl_credentials(tls_ca), options=channel_options)
        self._jobs = jobs_pb2_grpc.JobServiceStub(self._channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)

    # -- jobs -----------------------------------------------------------------------------------------

    def submit(
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
        """Submit one job and return it as stored (PENDING, or SCHEDULED when ``scheduled_at`` is ahead)."""
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
            response = self._jobs.SubmitJob(request, timeout=self.timeout, metadata=self.metadata)
        return Job.from_proto(response.job)

    def submit_many(self, specs: Sequence[JobSpec]) -> builtins.list[Job]:
        """Submit a batch in one ``SubmitJobs`` call; all are accepted or none is."""
        request = batch_request(specs)
        with translate_errors():
            response = self._jobs.SubmitJobs(request, timeout=self.timeout, metadata=self.metadata)
        return [Job.from_proto(pb) for pb in response.jobs]

    def get(self, id: str) -> Job:
        """Return the job ``id``; :class:`~corral.errors.NotFound` when there is none."""
        with translate_errors():
            pb = self._jobs.GetJob(by_id(jobs_pb2.GetJobRequest, id), timeout=self.timeout, metadata=self.metadata)
        return Job.from_proto(pb)

    def list(
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
            response = self._jobs.ListJobs(
                list_request(status, type, limit, offset, owner), timeout=self.timeout, metadata=self.metadata
            )
        return JobPage([Job.from_proto(pb) for pb in response.jobs], response.total)

    def cancel(self, id: str) -> Job:
        """Cancel a job that has not finished (a running one is killed) and return it."""
        with translate_errors():
            pb = self._jobs.CancelJob(
                by_id(jobs_pb2.CancelJobRequest, id), timeout=self.timeout, metadata=self.metadata
            )
        return Job.from_proto(pb)

    def retry(self, id: str) -> Job:
        """Re-drive a FAILED job with a fresh attempt budget and return it."""
        with translate_errors():
            pb = self._jobs.RetryJob(by_id(jobs_pb2.RetryJobRequest, id), timeout=self.timeout, metadata=self.metadata)
        return Job.from_proto(pb)

    def watch(self, id: str) -> Generator[Job, None, None]:
        """Yield the job now and after every change; the iteration ends at a terminal state.

        A restart of the control plane does not end it: the job is watched again and each state is
        still yielded once (:mod:`corral.follow` says when it gives up). Closing the generator (or
        leaving a ``with contextlib.closing(...)`` block) cancels the stream.
        """
        return self._follow(Follow(id))

    def wait(self, id: str, timeout: float | None = None) -> Job:
        """Block until the job is terminal and return it, across control-plane restarts
        (:mod:`corral.follow`); :class:`~corral.errors.DeadlineExceeded` after ``timeout``."""
        job: Job | None = None
        with closing(self._follow(Follow(id, timeout))) as updates:
            for job in updates:  # noqa: B007 (the last one is the answer)
                pass
        assert job is not None and job.is_terminal  # following ends only at a terminal state
        return job

    def _follow(self, follow: Follow) -> Generator[Job, None, None]:
        while True:
            error: CorralError | None = None
            try:
                with closing(self._watch(follow.job_id, follow.remaining())) as updates:
                    for job in updates:
                        if follow.is_new(job):
                            yield job
                        if job.is_terminal:
                            return
            except DeadlineExceeded:
                raise follow.timed_out() from None
            except CorralError as exc:
                error = exc  # pause() raises it unless the control plane went away (corral.follow)
            time.sleep(follow.pause(error))

    def _watch(self, id: str, timeout: float | None) -> Generator[Job, None, None]:
        call = self._jobs.WatchJob(by_id(jobs_pb2.WatchJobRequest, id), timeout=timeout, metadata=self.metadata)
        try:
            with translate_errors():
                for event in call:
                    yield Job.from_proto(event.job)
        finally:
            call.cancel()

    # -- cluster --------------------------------------------------------------------------------------

    def stats(self) -> Stats:
        """Return queue depth, workers, jobs by status, success rate and uptime."""
        with translate_errors():
            pb = self._jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=self.timeout, metadata=self.metadata)
        return Stats.from_proto(pb)

    def workers(self) -> builtins.list[WorkerInfo]:
        """Return the registered workers."""
        with translate_errors():
            response = self._admin.ListWorkers(
                admin_pb2.ListWorkersRequest(), timeout=self.timeout, metadata=self.metadata
            )
        return [WorkerInfo.from_proto(pb) for pb in response.workers]

    def drain_worker(self, id: str) -> WorkerInfo:
        """Stop giving the worker jobs and ask it to finish what it runs and leave."""
        with translate_errors():
            pb = self._admin.DrainWorker(
                by_id(admin_pb2.DrainWorkerRequest, id), timeout=self.timeout, metadata=self.metadata
            )
        return WorkerInfo.from_proto(pb)

    def autoscaler(self) -> AutoscalerStatus:
        """Return what the autoscaler is doing."""
        with translate_errors():
            pb = self._admin.GetAutoscaler(
                admin_pb2.GetAutoscalerRequest(), timeout=self.timeout, metadata=self.metadata
            )
        return AutoscalerStatus.from_proto(pb)

    # -- lifecycle ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled. Idempotent."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.address!r})"


def call_timeout(value: float | None) -> float | None:
    """Check a client's per-call deadline: seconds > 0, or None for none.

    Raises:
        InvalidArgument: on ``timeout`` otherwise (0 or less would fail every call at once).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise InvalidArgument("timeout", f"must be a number of seconds > 0, or None, got {value!r}")
    return float(value)


def list_request(
    status: Iterable[JobState | str], type: str, limit: int, offset: int, owner: str = ""
) -> jobs_pb2.ListJobsRequest:
    """Build a ``ListJobsRequest``; states may be given by name (case-insensitive)."""
    if isinstance(status, str | JobState):
        status = [status]
    states = [jobs_pb2.Job.State.Value(JobState.parse(s).name) for s in status]
    request = jobs_pb2.ListJobsRequest(status=states)
    put(request, "type", type)
    put(request, "limit", limit)
    put(request, "offset", offset)
    put(request, "owner", owner)
    return request
