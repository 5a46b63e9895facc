"""The synchronous Python client, :class:`Client`, over the ``corral.v1`` gRPC stubs.

Every call goes through :func:`corral.status.translate_errors`, so a failure is always a
:class:`corral.errors.CorralError` (never a ``grpc.RpcError``); the asyncio twin with the same methods is
:class:`corral.aio.AsyncClient`. Both build requests the same way
(:meth:`JobSpec.to_proto`, :func:`list_request`).

Given a comma-separated list of addresses (a control plane and its standbys on one database), a client
sends each call to the address that took the last one and moves on round the list when a standby refuses
the call or it cannot be sent there; a call that may have reached a control plane is never sent twice
(:mod:`corral.failover`).

Example::

    with corral.Client("127.0.0.1:50051") as client:
        job = client.submit("add_numbers", {"a": 1, "b": 2})
        print(client.wait(job.id).result)  # {'sum': 3}
"""

from __future__ import annotations

import builtins
import functools
import math
import os
import threading
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.experimental

from corral.account import Account, Identity, Login, account_request
from corral.audit import AuditPage, audit_request
from corral.cluster import AutoscalerStatus, Shares, Stats, WorkerInfo
from corral.errors import ClientClosed, CorralError, DeadlineExceeded, InvalidArgument
from corral.failover import RECONNECT_OPTIONS, Failover, client_addresses, unreached
from corral.follow import Follow, FollowMany
from corral.job import Changed, Job, JobPage, JobState, Notify
from corral.job_ids import watched_ids
from corral.printed import OutputChunk, PrintedCursor
from corral.run_streams import RunStream, RunStreams
from corral.spec import JobSpec, When, batch_request, by_id, put, put_pairs
from corral.status import translate_errors
from corral.transport import keepalive
from corral.v1 import accounts_pb2, accounts_pb2_grpc, admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc

_T = TypeVar("_T")

KEEPALIVE_SEC = 5.0
"""While a call is open the client pings the control plane this often, and gives the connection up
when a ping is unanswered as long: a watch on a connection that went silent (a partition) fails
UNAVAILABLE within about twice this, and is watched again (corral.follow), instead of hanging for ever."""
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", 64 << 20),  # payloads and results (a binary array can be megabytes)
    *keepalive(KEEPALIVE_SEC, KEEPALIVE_SEC),
    # Connections of its own: by default gRPC shares them between channels to the same address in a
    # process, and a new client then inherited another's failing, backing-off connection to a control
    # plane that had gone: its first call failed at once with the old "Connection refused" although the
    # control plane was back on the same port (tests/fault/test_client_channels.py).
    ("grpc.use_local_subchannel_pool", 1),
)
SYNC_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    *DEFAULT_CHANNEL_OPTIONS,
    # A stream (WatchJob, RunJob) is read on the thread that iterates it, not handed over from gRPC's
    # channel thread: one wake-up less per event. Measured against a real control plane, RunJob round
    # trips alternated between two channels, five runs of 1,450 each: p50 0 to 6% lower (median 2%),
    # never higher. The iterating thread still sees Ctrl-C (gRPC checks for signals while it waits).
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
)
"""The options of :class:`Client`'s channels (blocking gRPC); :class:`AsyncClient` uses the first ones."""

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

Metadata = Sequence[tuple[str, str | bytes]]
"""gRPC metadata sent with every call, e.g. ``[("x-request-id", "abc")]``; a key ending in ``-bin`` takes bytes."""

TlsCa = str | os.PathLike[str] | bytes
"""A CA for TLS: a PEM file's path, or the PEM bytes themselves."""


def auth_metadata(token: str | None, metadata: Metadata = ()) -> tuple[tuple[str, str | bytes], ...]:
    """``metadata`` plus ``authorization: Bearer <token>`` when there is a token.

    Raises:
        InvalidArgument: on ``token`` when it is not printable ASCII without spaces, as every Corral token
            is. gRPC cannot send other characters in metadata: each call failed INTERNAL "Invalid
            metadata", after gRPC's own error lines on stderr. The message does not quote the token.
            On ``metadata`` for an entry gRPC cannot send (a key that is not lowercase ASCII, a value
            that is not printable ASCII, a ``-bin`` key without bytes), or an ``authorization`` entry
            beside a token.
    """
    pairs = tuple(metadata)
    for i, pair in enumerate(pairs):
        _check_metadata_pair(i, pair)
    if token:
        bad = next((i for i, ch in enumerate(token) if not "!" <= ch <= "~"), None)
        if bad is not None:
            raise InvalidArgument(
                "token",
                f"must be printable ASCII without spaces, got {token[bad]!r} at character {bad + 1} of {len(token)}",
            )
        if any(key == "authorization" for key, _ in pairs):
            # Two would leave it to the server which one counts.
            raise InvalidArgument("metadata", "must not hold 'authorization' when a token is given: pass one of them")
        return (*pairs, ("authorization", f"Bearer {token}"))
    return pairs


_METADATA_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def _check_metadata_pair(index: int, pair: object) -> None:
    """Refuse, before any call, a metadata entry gRPC cannot send. gRPC itself fails every call with
    INTERNAL "Invalid metadata" (after its own error lines on stderr), or raises a bare TypeError.

    Raises:
        InvalidArgument: on ``metadata``, naming the entry and the rule.
    """
    if not (isinstance(pair, tuple | list) and len(pair) == 2):
        raise InvalidArgument("metadata", f"entry {index + 1} must be a (key, value) pair, got {pair!r}")
    key, value = pair
    if not isinstance(key, str) or not key or not set(key) <= _METADATA_KEY_CHARS:
        raise InvalidArgument(
            "metadata",
            f"entry {index + 1}: a key must be lowercase ASCII letters, digits, '-', '_' or '.', got {key!r}",
        )
    if key.endswith("-bin"):
        if not isinstance(value, bytes):
            raise InvalidArgument(
                "metadata", f"{key!r}: a key ending in '-bin' takes bytes, got {type(value).__name__}"
            )
        return
    if not isinstance(value, str):
        raise InvalidArgument("metadata", f"{key!r}: the value must be a string, got {type(value).__name__}")
    bad = next((i for i, ch in enumerate(value) if not " " <= ch <= "~"), None)
    if bad is not None:
        raise InvalidArgument(
            "metadata",
            f"{key!r}: the value must be printable ASCII (or the key end in '-bin' for bytes), "
            f"got {value[bad]!r} at character {bad + 1}",
        )


def ssl_credentials(tls_ca: TlsCa) -> grpc.ChannelCredentials:
    """Channel credentials that verify the control plane against ``tls_ca``."""
    if isinstance(tls_ca, bytes):
        return grpc.ssl_channel_credentials(tls_ca)
    with open(tls_ca, "rb") as f:
        return grpc.ssl_channel_credentials(f.read())


@dataclass(frozen=True)
class _Connection:
    """One address's channel and the stubs over it."""

    channel: grpc.Channel
    jobs: jobs_pb2_grpc.JobServiceStub
    admin: admin_pb2_grpc.AdminServiceStub
    accounts: accounts_pb2_grpc.AccountServiceStub


class Client:
    """A blocking client of a control plane; thread-safe, one channel per address, close it when done.

    Args:
        address: ``host:port`` of the control plane's gRPC server, or a comma-separated list of up
            to 16 (a control plane and its standbys: ``"cp-a:50051,cp-b:50051"``), which the client
            fails over between (:mod:`corral.failover`).
        timeout: Deadline in seconds of each unary call (``None``: no deadline). Streams have none.
        metadata: Sent with every call.
        options: Extra gRPC channel options.
        token: A client token, sent as ``authorization: Bearer <token>`` with every call.
        tls_ca: Speak TLS and verify the control plane against this CA (PEM file path or bytes).

    Raises:
        InvalidArgument: a list with an empty entry, an address twice, more than 16 entries or an entry
            that is not HOST:PORT (``field`` is ``address``; the message names the entry), or a bad ``timeout``.
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
        channel_options = [*SYNC_CHANNEL_OPTIONS, *reconnect, *options]
        credentials = None if tls_ca is None else ssl_credentials(tls_ca)

        def connect(target: str) -> _Connection:
            if credentials is None:
                channel = grpc.insecure_channel(target, options=channel_options)
            else:
                channel = grpc.secure_channel(target, credentials, options=channel_options)
            return _Connection(
                channel,
                jobs_pb2_grpc.JobServiceStub(channel),
                admin_pb2_grpc.AdminServiceStub(channel),
                accounts_pb2_grpc.AccountServiceStub(channel),
            )

        self._failover = Failover(self.addresses, connect)
        self._runs: RunStreams[RunStream] = RunStreams()
        self._closing = threading.Event()
        """Set by :meth:`close`, then replaced: a call holds the one it started under, and ends with
        ClientClosed once it is set (calls started after a close get the new one)."""
        # Every channel is made now rather than on first use: a thread-safe client then needs no lock
        # around making one, and a gRPC channel opens no connection before its first call, so an
        # address that is never needed costs an object, not a socket.
        for target in self.addresses:
            self._failover.connection(target)

    @property
    def current_address(self) -> str:
        """The address the next call goes to first: the one that took the last call (the first at the start)."""
        return self._failover.current

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
        gpu_count: int = 0,
        memory_mb: int = 0,
        notify: Sequence[Notify] = (),
        start_when: str = "ALL_SUCCEEDED",
    ) -> Job:
        """Submit one job and return it as stored (PENDING, or SCHEDULED when ``scheduled_at`` is ahead).

        The arguments are the fields of :class:`~corral.spec.JobSpec`, which says what each means (e.g.
        ``gpu_count`` and ``memory_mb``, in MiB: what the job holds on the worker that runs it).

        Raises:
            InvalidArgument: naming the field, for a value the request cannot carry or outside its limits
                (:meth:`JobSpec.to_proto <corral.spec.JobSpec.to_proto>`), before anything is sent.
        """
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
        response = self._unary(lambda c: c.jobs.SubmitJob, request)
        return Job.from_proto(response.job)

    def submit_many(self, specs: Sequence[JobSpec]) -> builtins.list[Job]:
        """Submit a batch in one ``SubmitJobs`` call; all are accepted or none is."""
        request = batch_request(specs)
        response = self._unary(lambda c: c.jobs.SubmitJobs, request)
        return [Job.from_proto(pb) for pb in response.jobs]

    def get(self, id: str) -> Job:
        """Return the job ``id``; :class:`~corral.errors.NotFound` when there is none."""
        pb = self._unary(lambda c: c.jobs.GetJob, by_id(jobs_pb2.GetJobRequest, id))
        return Job.from_proto(pb)

    def list(
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
        """Return a page of jobs, newest first, filtered by state(s), type, owner, labels (a job matches
        when its labels include every one given) and the error its latest attempt ended with, with the
        total that match. (A control plane that keeps clients apart lists only the caller's jobs to all
        but its admins.)"""
        request = list_request(status, type, limit, offset, owner, labels=labels, error_code=error_code)
        response = self._unary(lambda c: c.jobs.ListJobs, request)
        return JobPage([Job.from_proto(pb) for pb in response.jobs], response.total)

    def queue(
        self,
        *,
        type: str = "",
        limit: int = 50,
        offset: int = 0,
        owner: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> JobPage:
        """Return a page of the queue: PENDING jobs in the order they are offered to workers, each with
        its :attr:`~Job.queue_position` among all of them and its :attr:`~Job.estimated_start`, filtered
        by type, owner and labels, with the total that match."""
        request = list_request((), type, limit, offset, owner, queue=True, labels=labels)
        response = self._unary(lambda c: c.jobs.ListJobs, request)
        return JobPage([Job.from_proto(pb) for pb in response.jobs], response.total)

    def cancel(self, id: str) -> Job:
        """Cancel a job that has not finished (a running one is killed) and return it."""
        pb = self._unary(lambda c: c.jobs.CancelJob, by_id(jobs_pb2.CancelJobRequest, id))
        return Job.from_proto(pb)

    def cancel_many(
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
        """Cancel, in one call, the unfinished jobs that match every filter given: among ``ids``, in
        one of the states ``status`` (SCHEDULED, PENDING, RUNNING), of ``type``, of ``owner``, with all
        of ``labels``; ``all=True`` is needed when none is given. At most ``limit`` (1 to 10,000, 0 for
        10,000), oldest first; :attr:`Changed.remaining` says how many more matched."""
        request = cancel_request(ids, status, type, owner, labels, all, limit)
        response = self._unary(lambda c: c.jobs.CancelJobs, request)
        return Changed(list(response.ids), response.remaining)

    def retry(self, id: str) -> Job:
        """Re-drive a FAILED job with a fresh attempt budget and return it."""
        pb = self._unary(lambda c: c.jobs.RetryJob, by_id(jobs_pb2.RetryJobRequest, id))
        return Job.from_proto(pb)

    def retry_many(
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
        """Re-drive, in one call, the FAILED jobs that match every filter given (the dead-letter queue
        after an outage, say): among ``ids``, of ``type``, of ``owner``, with all of ``labels``, whose
        last attempt ended with ``error_code`` (``"TIMEOUT"``, say); ``all=True`` is needed when none is
        given. At most ``limit`` (1 to 1,000, 0 for 1,000), oldest first; :attr:`Changed.remaining` says
        how many more matched."""
        request = retry_request(ids, type, owner, labels, all, limit, error_code)
        response = self._unary(lambda c: c.jobs.RetryJobs, request)
        return Changed(list(response.ids), response.remaining)

    def watch(self, id: str) -> Generator[Job, None, None]:
        """Yield the job now and after every change; the iteration ends at a terminal state.

        A restart of the control plane does not end it: the job is watched again and each state is
        still yielded once (:mod:`corral.follow` says when it gives up). Closing the generator (or
        leaving a ``with contextlib.closing(...)`` block) cancels the stream.
        """
        return self._follow(Follow(id, address=self.address), self._closing)

    def watch_output(self, id: str) -> Generator[OutputChunk, None, None]:
        """Yield what the job prints, as it prints it (``WatchOutput``), until the job ends: first the
        end of what its running attempt printed so far (or, for a job that stopped, its stored output),
        then each piece a few times a second, through retries (each chunk names its attempt).

        A chunk whose offset is past the end of the last one of its attempt follows text that was left
        out (a job that printed faster than it is streamed). A restart of the control plane does not end
        it: the output is watched again and each character still yielded once (:mod:`corral.printed`,
        :mod:`corral.follow` says when it gives up). Closing the generator cancels the stream.
        """
        follow = Follow(id)
        cursor = PrintedCursor()
        request = by_id(jobs_pb2.WatchOutputRequest, id)

        def start(address: str, conn: _Connection) -> tuple[Generator[OutputChunk, None, None], Callable[[], None]]:
            call = conn.jobs.WatchOutput(request, metadata=self.metadata)
            return (OutputChunk(c.attempt, c.offset, c.text) for c in call), call.cancel

        closed = self._closing
        while True:
            try:
                with closing(self._served(start, closed)) as chunks:
                    for chunk in chunks:
                        follow.reached()
                        if (fresh := cursor.take(chunk)) is not None:
                            yield fresh.chunk
                return  # the stream ends once the job has ended
            except CorralError as exc:
                _pause(closed, follow.pause(exc))  # raises it unless the control plane went away

    def wait(self, id: str, timeout: float | None = None) -> Job:
        """Block until the job is terminal and return it, across control-plane restarts
        (:mod:`corral.follow`); :class:`~corral.errors.DeadlineExceeded` after ``timeout`` seconds
        (``timeout=0`` looks once: the job if it has ended, else DeadlineExceeded)."""
        return _last(self._follow(Follow(id, timeout, address=self.address), self._closing))

    def watch_many(
        self, ids: Iterable[str], *, ends_only: bool = False, timeout: float | None = None
    ) -> Generator[Job, None, None]:
        """Yield each job now, then after every change, until every one has ended (one ``WatchJobs``
        stream for up to 10,000 jobs, where :meth:`watch` opens one per job); with ``ends_only``, only
        each job's terminal state. Jobs interleave; one job's states come in order, each once.

        A restart of the control plane does not end it: the jobs not ended yet are watched again
        (:mod:`corral.follow` says when it gives up); :class:`~corral.errors.DeadlineExceeded` after
        ``timeout`` seconds, naming how many had not ended (``timeout=0`` looks once: it yields each job
        now, or with ``ends_only`` those that have ended, then raises unless all have). Closing the
        generator cancels the stream.

        Raises:
            InvalidArgument: on ``ids`` (none, over 10,000, a repeat, an id that is not a string of 1 to
                128 characters) or ``timeout``, before anything is sent.
            NotFound: an id that names no job.
        """
        return self._follow_many(FollowMany(ids, timeout, ends_only, address=self.address))

    def wait_all(self, ids: Iterable[str], timeout: float | None = None) -> builtins.list[Job]:
        """Block until every job has ended and return them terminal, in the order of ``ids``: one
        ``WatchJobs`` stream that carries only the ends; as :meth:`watch_many` across restarts, on bad
        input and on ``timeout`` (0: the jobs if all have ended, else DeadlineExceeded)."""
        follow = FollowMany(ids, timeout, ends_only=True, address=self.address)
        for _ in self._follow_many(follow):
            pass
        return follow.ends()

    def _follow_many(self, follow: FollowMany) -> Generator[Job, None, None]:
        closed = self._closing
        while not follow.done:
            error: CorralError | None = None
            limit = follow.opening()  # before request(): a check asks for more than the ends
            updates = self._stream(lambda c: c.jobs.WatchJobs, follow.request(), limit, closed)
            try:
                with closing(updates):
                    for job in updates:
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
                _pause(closed, follow.pause(error))

    def run(
        self, type: str, payload: Mapping[str, Any] | None = None, *, timeout: float | None = None, **fields: Any
    ) -> Job:
        """Submit one job and wait until it ends; return it terminal.

        The other keyword arguments are :meth:`submit`'s (the fields of :class:`~corral.spec.JobSpec`).
        It costs one round trip less than :meth:`submit` then :meth:`wait`: the job is sent on a
        ``RunJobs`` stream that the client keeps open from one ``run`` to the next
        (:mod:`corral.run_streams`), or with a ``timeout``, in one ``RunJob`` call with that deadline
        (a blocking read of an open stream cannot time out). The submission is sent once,
        as :meth:`submit` sends it: an error before the job was accepted is raised, and whether to send
        it again is the caller's choice (an idempotency key makes that safe). Once accepted, the job is
        followed as :meth:`wait` follows it, across control-plane restarts;
        :class:`~corral.errors.DeadlineExceeded` after ``timeout`` seconds (None: no limit).

        Raises:
            InvalidArgument: naming the field, as :meth:`submit` does, before anything is sent.
        """
        return _last(self.submit_and_watch(type, payload, timeout=timeout, **fields))

    def submit_and_watch(
        self, type: str, payload: Mapping[str, Any] | None = None, *, timeout: float | None = None, **fields: Any
    ) -> Generator[Job, None, None]:
        """What :meth:`run` does, yielding the job as accepted and after every change, as :meth:`watch`
        yields it; the iteration ends at a terminal state."""
        request = JobSpec(type=type, payload=payload, **fields).to_proto()
        follow = Follow("", timeout, address=self.address)
        closed = self._closing
        if timeout is None:
            return self._follow(follow, closed, lambda: self._run_on_stream(request, closed))
        return self._follow(
            follow, closed, lambda: self._stream(lambda c: c.jobs.RunJob, request, follow.remaining(), closed)
        )

    def _follow(
        self,
        follow: Follow,
        closed: threading.Event,
        submit: Callable[[], Generator[Job, None, None]] | None = None,
    ) -> Generator[Job, None, None]:
        """Follow ``follow.job_id`` to its end; with ``submit``, first the stream that submits it (its
        first event names the job), then follow it as any other. ``closed``: the client's close event
        when the follow began (set: it ends with ClientClosed, and opens no new stream)."""
        while True:
            error: CorralError | None = None
            if submit is not None:
                updates = submit()
            else:
                watch = by_id(jobs_pb2.WatchJobRequest, follow.job_id)
                updates = self._stream(lambda c: c.jobs.WatchJob, watch, follow.opening(), closed)
            try:
                with closing(updates):
                    for job in updates:
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
            _pause(closed, pause)

    def _run_on_stream(self, request: jobs_pb2.SubmitJobRequest, closed: threading.Event) -> Generator[Job, None, None]:
        """``request``'s job from acceptance to its end, on a kept RunJobs stream (corral.run_streams)."""

        def start(address: str, conn: _Connection) -> tuple[Generator[Job, None, None], Callable[[], None]]:
            stream = self._runs.borrow(address, functools.partial(RunStream, address, conn.jobs.RunJobs, self.metadata))
            return stream.run(request), lambda: self._runs.give_back(stream)

        return self._served(start, closed)

    def _stream(
        self, rpc: Callable[[_Connection], Any], request: Any, timeout: float | None, closed: threading.Event
    ) -> Generator[Job, None, None]:
        """The jobs of the server stream ``rpc(connection)(request)`` (WatchJob, RunJob)."""

        def start(address: str, conn: _Connection) -> tuple[Generator[Job, None, None], Callable[[], None]]:
            call = rpc(conn)(request, timeout=timeout, metadata=self.metadata)
            return (Job.from_proto(event.job) for event in call), call.cancel

        return self._served(start, closed)

    def _served(
        self,
        start: Callable[[str, _Connection], tuple[Generator[_T, None, None], Callable[[], None]]],
        closed: threading.Event,
    ) -> Generator[_T, None, None]:
        """The jobs of a stream that ``start(address, connection)`` opens (with what ends it, called
        however it ends). A stream moves on like a unary call, but only before its first event: after
        that the break is raised, and corral.follow watches again, from the address that served it.
        Once ``closed`` is set (the client was closed), it ends with ClientClosed, and opens nothing."""
        attempts = self._failover.attempts()
        for address, conn in attempts:
            # After taking the connection: a close() that set the event before this check took (and
            # closes) the connections after it, so a stream opened here is cut and fails below.
            if closed.is_set():
                raise ClientClosed()
            jobs, end = start(address, conn)
            served = False
            try:
                with translate_errors(), closing(jobs):
                    for job in jobs:
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

    def _unary(self, rpc: Callable[[_Connection], Any], request: Any) -> Any:
        """The answer of ``rpc(connection)(request)``, sent to the current address and on round the
        list while the failure allows (corral.failover)."""
        closed = self._closing
        attempts = self._failover.attempts()
        for address, conn in attempts:
            try:
                with translate_errors():
                    response = rpc(conn)(request, timeout=self.timeout, metadata=self.metadata)
            except CorralError as exc:
                if closed.is_set():
                    raise ClientClosed() from exc
                attempts.failed(address, unreached(exc, address, _connected(conn.channel)))
                continue
            attempts.took(address)
            return response
        raise attempts.exhausted()

    # -- cluster --------------------------------------------------------------------------------------

    def stats(self) -> Stats:
        """Return queue depth, workers, jobs by status, success rate and uptime."""
        pb = self._unary(lambda c: c.jobs.GetStats, jobs_pb2.GetStatsRequest())
        return Stats.from_proto(pb)

    def workers(self) -> builtins.list[WorkerInfo]:
        """Return the registered workers."""
        response = self._unary(lambda c: c.admin.ListWorkers, admin_pb2.ListWorkersRequest())
        return [WorkerInfo.from_proto(pb) for pb in response.workers]

    def drain_worker(self, id: str) -> WorkerInfo:
        """Stop giving the worker jobs and ask it to finish what it runs and leave."""
        pb = self._unary(lambda c: c.admin.DrainWorker, by_id(admin_pb2.DrainWorkerRequest, id))
        return WorkerInfo.from_proto(pb)

    def autoscaler(self) -> AutoscalerStatus:
        """Return what the autoscaler is doing."""
        pb = self._unary(lambda c: c.admin.GetAutoscaler, admin_pb2.GetAutoscalerRequest())
        return AutoscalerStatus.from_proto(pb)

    def shares(self) -> Shares:
        """Each share of the cluster (a group, or an owner in none), lowest fair-share rank first:
        what it holds and queues now, and the thread- and GPU-seconds it used (admins only)."""
        pb = self._unary(lambda c: c.admin.ListShares, admin_pb2.ListSharesRequest())
        return Shares.from_proto(pb)

    def audit(
        self,
        *,
        actor: str = "",
        action: str = "",
        target: str = "",
        outcome: str = "",
        limit: int = 100,
        offset: int = 0,
    ) -> AuditPage:
        """The audit log, newest first: the events whose fields equal those given (admins only)."""
        request = audit_request(actor, action, target, outcome, limit, offset)
        return AuditPage.from_proto(self._unary(lambda c: c.admin.ListAuditEvents, request))

    # -- accounts -------------------------------------------------------------------------------------

    def register(self, name: str, password: str) -> Account:
        """Create the account ``name`` with ``password`` (8 to 72 bytes of UTF-8) and return it.

        With ``CORRAL_ACCOUNTS=open`` anyone may; with ``admin``, only an admin.

        Raises:
            AlreadyExists: there is an account of that name.
            InvalidArgument: a name outside ``[A-Za-z0-9._@-]{1,64}`` or a password outside the limits.
            PermissionDenied: the caller may not create accounts.
        """
        request = account_request(accounts_pb2.RegisterRequest, name=name, password=password)
        return Account.from_proto(self._unary(lambda c: c.accounts.Register, request))

    def login(self, name: str, password: str) -> Login:
        """Log in to the account ``name``: the answer's token works as this client's ``token`` until
        :attr:`Login.expires_at <corral.account.Login.expires_at>`.

        Raises:
            Unauthenticated: a wrong name or a wrong password (the same error for either).
            RateLimited: after repeated failures for the name; ``retry_after`` says when to try again.
        """
        request = account_request(accounts_pb2.LoginRequest, name=name, password=password)
        return Login.from_proto(self._unary(lambda c: c.accounts.Login, request))

    def whoami(self) -> Identity:
        """Return who the control plane takes this client for: its principal, whether it is an admin and,
        after a login, the account and when the login expires."""
        pb = self._unary(lambda c: c.accounts.WhoAmI, accounts_pb2.WhoAmIRequest())
        return Identity.from_proto(pb)

    def accounts(self) -> builtins.list[Account]:
        """Return every account; admins only (:class:`~corral.errors.PermissionDenied` otherwise)."""
        response = self._unary(lambda c: c.accounts.ListAccounts, accounts_pb2.ListAccountsRequest())
        return [Account.from_proto(pb) for pb in response.accounts]

    def set_password(self, name: str, password: str, *, current_password: str = "") -> Account:
        """Set the password of the account ``name`` and return the account; every earlier login of it ends.

        An account changing its own password gives ``current_password``; an admin resets another's without it.

        Raises:
            Unauthenticated: a wrong ``current_password``.
            PermissionDenied: another's account, and the caller is not an admin.
            NotFound: there is no account ``name``.
        """
        request = account_request(
            accounts_pb2.SetPasswordRequest, name=name, password=password, current_password=current_password
        )
        return Account.from_proto(self._unary(lambda c: c.accounts.SetPassword, request))

    def delete_account(self, name: str) -> None:
        """Delete the account ``name`` and end its logins; its jobs stay. Admins, or the account itself.

        Raises:
            NotFound: there is no account ``name``.
            PermissionDenied: another's account, and the caller is not an admin.
        """
        request = account_request(accounts_pb2.DeleteAccountRequest, name=name)
        self._unary(lambda c: c.accounts.DeleteAccount, request)

    def end_all_logins(self) -> None:
        """End every login of every account at once (admins only); passwords stay, so people log in again.

        Raises:
            PermissionDenied: the caller does not manage accounts.
        """
        self._unary(lambda c: c.accounts.EndAllLogins, accounts_pb2.EndAllLoginsRequest())

    # -- lifecycle ------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the channels; calls in flight (in other threads: a ``wait``, a ``watch``, a ``run``, a
        unary call) end at once with :class:`~corral.errors.ClientClosed`, and a follow never watches
        again on a new channel. Idempotent; a call made after it opens new channels, as
        :meth:`corral.AsyncClient.close` does (before, it raised a bare ``ValueError``)."""
        # First: a call that sees its channel cut (or is about to open one) then knows it was closed.
        closed, self._closing = self._closing, threading.Event()
        closed.set()
        self._runs.close()
        for conn in self._failover.take_connections():
            conn.channel.close()

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
    status: Iterable[JobState | str],
    type: str,
    limit: int,
    offset: int,
    owner: str = "",
    queue: bool = False,
    labels: Mapping[str, str] | None = None,
    error_code: str = "",
) -> jobs_pb2.ListJobsRequest:
    """Build a ``ListJobsRequest``; states may be given by name (case-insensitive); ``queue``: the queue
    view (order QUEUE) instead of newest first; ``labels``: only jobs that have all of them."""
    request = jobs_pb2.ListJobsRequest(status=_states(status))
    put(request, "type", type)
    put(request, "error_code", error_code)
    put(request, "limit", limit)
    put(request, "offset", offset)
    put(request, "owner", owner)
    put_pairs(request.labels, "labels", labels)
    if queue:
        request.order = jobs_pb2.ListJobsRequest.QUEUE
    return request


def cancel_request(
    ids: Iterable[str] | None,
    status: Iterable[JobState | str],
    type: str,
    owner: str,
    labels: Mapping[str, str] | None,
    all: bool,
    limit: int,
) -> jobs_pb2.CancelJobsRequest:
    """Build a ``CancelJobsRequest`` (see :meth:`Client.cancel_many`)."""
    request = jobs_pb2.CancelJobsRequest(status=_states(status))
    return _narrowed(request, ids, type, owner, labels, all, limit)


def retry_request(
    ids: Iterable[str] | None,
    type: str,
    owner: str,
    labels: Mapping[str, str] | None,
    all: bool,
    limit: int,
    error_code: str = "",
) -> jobs_pb2.RetryJobsRequest:
    """Build a ``RetryJobsRequest`` (see :meth:`Client.retry_many`)."""
    request = jobs_pb2.RetryJobsRequest()
    put(request, "error_code", error_code)
    return _narrowed(request, ids, type, owner, labels, all, limit)


_R = TypeVar("_R", jobs_pb2.CancelJobsRequest, jobs_pb2.RetryJobsRequest)


def _narrowed(
    request: _R,
    ids: Iterable[str] | None,
    type: str,
    owner: str,
    labels: Mapping[str, str] | None,
    all: bool,
    limit: int,
) -> _R:
    """``request`` (a call that changes many jobs) with its filters set; ``ids`` are checked as the
    control plane checks them (1 to 10,000, each once)."""
    if ids is not None:
        request.ids.extend(watched_ids(ids))
    put(request, "type", type)
    put(request, "owner", owner)
    put_pairs(request.labels, "labels", labels)
    put(request, "all", all)
    put(request, "limit", limit)
    return request


def _states(status: Iterable[JobState | str]) -> list[jobs_pb2.Job.State.ValueType]:
    """The proto values of states given by value or by name (case-insensitive), one or many;
    :class:`InvalidArgument` on ``status`` for anything else (see :meth:`JobState.parse`)."""
    if isinstance(status, str | int) or not isinstance(status, Iterable):  # one state (a JobState is an int), or None
        status = [status]
    return [jobs_pb2.Job.State.Value(JobState.parse(s).name) for s in status]


def _pause(closed: threading.Event, seconds: float) -> None:
    """Wait ``seconds`` before following again, or raise at once when the client is closed meanwhile.

    Raises:
        ClientClosed: ``closed`` is set.
    """
    if closed.wait(seconds):
        raise ClientClosed()


def _connected(channel: grpc.Channel) -> bool:
    """Whether ``channel`` has a connection to its server (READY) now; True when grpc does not say.

    The blocking channel's state is read through grpc's own object (the public ``subscribe`` answers on
    another thread, later): a deadline that passed on a channel that is not READY reached no server."""
    check = getattr(getattr(channel, "_channel", None), "check_connectivity_state", None)
    if check is None:
        return True
    try:
        state = check(False)
    except Exception:  # a grpc whose internals differ: leave the deadline as it is
        return True
    return bool(state == _READY)


def _ready_state() -> object:
    """grpc's READY connectivity state as its blocking channel reports it (2 where grpc does not name it)."""
    states = getattr(getattr(getattr(grpc, "_cython", None), "cygrpc", None), "ConnectivityState", None)
    return getattr(states, "ready", 2)


_READY = _ready_state()


def _last(updates: Generator[Job, None, None]) -> Job:
    """The terminal job a follow ends with (the stream is closed however it ends)."""
    job: Job | None = None
    with closing(updates):
        for job in updates:  # noqa: B007 (the last one is the answer)
            pass
    assert job is not None and job.is_terminal  # following ends only at a terminal state
    return job
