"""Connection: the worker's one bidirectional stream to the control plane (WorkerService.Connect).

One session of the stream::

    worker                                   control plane
      Register{id, threads, slots, gpus,
               memory_mb, types,
               running, finished,
               registered_since}       --->
                                       <---  Registered{heartbeat_interval_sec, heartbeat_timeout_sec,
                                                        registered_at, adopted, rejected}
      (kill rejected attempts; resend every unacknowledged result)
      Heartbeat{running}  every interval --->
      JobOutput{attempt, offset, text} --->  (what a running attempt printed lately; before its result)
                                       <---  Assign{assignments}  -> RunnerPool.submit
                                       <---  Cancel{attempt}      -> RunnerPool.kill(CANCELLED)
      Results{results}                 --->  (results of one event-loop turn or more, in one message)
                                       <---  Ack{attempts}        -> forget those results
                                       <---  Drain{deadline_sec}  -> on_drain(deadline_sec)
      Draining{deadline_sec}           --->  (while draining: assignments are handed back at once)

A broken stream (control plane killed, restarted, network) never stops the worker: jobs keep
running, their results are kept, and the connection retries with exponential backoff and jitter
(the n-th retry waits uniform(d/2, d) with d = min(reconnect_max_sec, 0.05 * 2**n)), re-registers
under the same worker_id listing what still runs (``running``) and what finished unacknowledged
(``finished``), then resends those results. Every result is kept until an Ack names its attempt. It
also sends back the time of its first registration (``registered_since``): an attempt leased to it since
then that it lists in neither was never received (lost with the stream, or with a control plane killed
before sending it), and goes back in line without costing the job an attempt.

Failover: CORRAL_CONTROL_ADDR may list several control planes (one serving, standbys on the same
database). A session uses one address; :class:`worker.reconnect.AddressRotation` picks the next. An attempt that does
not register moves on to the next address (round the list), and n counts whole rounds, not attempts,
so a dead first address costs one short wait before the live one is tried, not a growing backoff.
After a session registered, the next attempt goes to the same address first (after a network blip it
is most likely still the one serving), then on round the list. With one address this is the schedule
above, unchanged.

With a worker token the stream carries ``authorization: Bearer <token>``; with TLS settings the channel
is TLS (mutual TLS with a client certificate). The files are read once, when the connection is made.
A control plane that refuses the credentials (UNAUTHENTICATED) is retried like any broken stream, and
the reason is logged each time. So is a session that would leave the worker fewer than
:data:`corral.open_files.CONNECT_RESERVE` open files: it is not tried (gRPC would abort the worker,
which takes its running jobs with it), and the worker looks again after the wait (``worker_files_short``).

All writes go through one writer task (gRPC allows one write in flight); results wait in a list
that the writer takes whole, so completions that arrive while a write is in flight share the next
Results message. Other messages wait in an outbox, which the writer empties before each Results
message: an attempt's output, queued before its result, goes out before it.

A worker that stood still longer than the control plane's heartbeat timeout (the process stopped or
frozen with its VM, its event loop blocked) may have been counted lost meanwhile, and its jobs given to
others. The assignments it then reads were sent before that: it starts none of them, hands each back
(HANDED_BACK costs the job no attempt; the control plane ignores it if the attempt moved on), ends the
session and registers again, listing what still runs so the control plane keeps or kills each. A
watchdog task ticks a few times per timeout; a gap between ticks longer than the timeout is such a
stand-still, and so is an assignment read when the last tick is that old (the reader may run first).
The control plane, though, counts the time since it last heard from the worker (a Register, Heartbeat
or Results message), which can be up to a heartbeat interval longer than the time since the last tick:
so a stand-still is also a time longer than the timeout since the worker last wrote one of those,
judged before each such write too (a heartbeat written after resuming must not hide it).

Live output is best effort: an attempt's JobOutput is dropped (and counted) while no session is
registered, or when :data:`MAX_QUEUED_OUTPUT` of them already wait (a stalled stream); the end of
what the attempt printed travels with its result anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from importlib import metadata

import grpc

from corral import open_files
from corral.logs import (
    WORKER_CONNECTING,
    WORKER_DISCONNECTED,
    WORKER_FILES_SHORT,
    WORKER_HEARTBEAT,
    WORKER_REFUSED,
    WORKER_REGISTERED,
    WORKER_STALLED,
)
from corral.transport import keepalive
from corral.v1 import workers_pb2 as pb
from corral.v1 import workers_pb2_grpc as pb_grpc
from worker.attempt import Completion, JobSpec, Outcome
from worker.config import WorkerConfig
from worker.pool import RunnerPool, RunnerType
from worker.reconnect import AddressRotation

__all__ = ["Connection", "channel_credentials"]

logger = logging.getLogger(__name__)

REGISTER_TIMEOUT_SEC = 10.0
"""How long to wait for Registered (connecting, sending Register, reading the answer) before trying
again: with several addresses, one that swallows packets must not hold the worker away from the others."""
RESULTS_LINGER_SEC = 0.001
"""Longest a finished job's result waits for others still running on this worker, so that their
results share one Results message (the stream's per-message cost dominates short jobs). A result
goes out at once when nothing else is running."""
SHORT_JOB_LINGER_SEC = 0.003
"""The same wait when the job whose result waits ran for less than this, and only for jobs that started
less than this ago (short ones too, likely to end soon; a long one running beside it is not waited for).
A job that short costs less than the messages about it (a few hundred µs of CPU per gRPC message on a
small machine), so saving messages is worth more than the slot it leaves idle; for a longer job the idle
slot costs more, and RESULTS_LINGER_SEC holds. Measured with ``python -m bench throughput`` (noop jobs,
4 slots per worker) in eleven runs alternated with the flat 1 ms wait (three of this rule, eight of
the same without the check for long jobs): completed/s a median 5% higher (from -20% to +15% on this
noisy machine), the worker agents' CPU per job lower in ten of the eleven. One-slot workers never wait."""
RESULTS_BATCH_BYTES = 1 << 20
"""A Results message carries at most this many bytes (on the wire, what a job printed included), unless
it holds one result that is larger by itself."""
MAX_QUEUED_OUTPUT = 64
"""JobOutput messages waiting to be written past which more are dropped: a stalled stream must not
pile up live output (up to 16 Ki characters each), which the results would then wait behind."""

_REFUSALS = frozenset(
    {
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)
"""Codes with which the control plane refuses a registration (the worker keeps trying, and says so)."""
_OUTCOMES = {outcome: pb.JobResult.Outcome.Value(outcome.value) for outcome in Outcome}
KEEPALIVE_SEC = 2.0
"""How often the worker pings the control plane's connection (HTTP/2 PING, answered by gRPC itself)."""
KEEPALIVE_TIMEOUT_SEC = 3.0
"""A ping unanswered this long ends the connection and the worker connects again. Without it a
connection that went silent with no FIN or RST (a partition, a control-plane host that lost power)
went unnoticed for many minutes, and the control plane reaped the worker meanwhile. Together with
KEEPALIVE_SEC it stays under the default heartbeat timeout (10 s), so the worker is back in time to
keep its jobs."""
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    *keepalive(KEEPALIVE_SEC, KEEPALIVE_TIMEOUT_SEC),
]


def _version() -> str:
    try:
        return metadata.version("corral")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class Connection:
    """The Connect stream, kept up for as long as the connection runs; see the module docstring."""

    def __init__(
        self,
        config: WorkerConfig,
        pool: RunnerPool,
        job_types: Sequence[RunnerType],
        on_drain: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """Prepare a connection; ``on_drain(deadline_sec)`` runs when the control plane sends Drain."""
        self._config = config
        self._pool = pool
        self._on_drain = on_drain
        self._rng = rng or random.Random()
        self._job_types = [
            pb.JobTypeInfo(name=t.name, payload_schema_json=t.schema_json, description=t.description) for t in job_types
        ]
        self._unacked: dict[tuple[str, int], pb.JobResult] = {}
        self._pending: list[pb.JobResult] = []
        self._outbox: deque[pb.WorkerMessage] = deque()
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()
        self._all_acked = asyncio.Event()
        self._all_acked.set()
        self.registered = asyncio.Event()
        """Set while a session is registered (cleared when the stream breaks)."""
        self.heartbeat_interval_sec = 0.0
        """The interval the control plane asked for in the last Registered."""
        self.heartbeat_timeout_sec = 0.0
        """The silence after which the control plane counts this worker lost (last Registered; 0: not said)."""
        self.stalls = 0
        """Sessions given up because the worker stood still longer than the heartbeat timeout."""
        self.registered_since = 0.0
        """The control plane's time of this process's first registration (sent back in every Register, so
        that an attempt leased since then which this process never got costs its job no attempt)."""
        self._ticked_at = 0.0  # loop time of the watchdog's last tick (or of the registration)
        self._heard_at = 0.0  # loop time of the last write the control plane counts as a sign of life
        self._stalled = False  # this session outlived a stand-still: start nothing read on it
        self.sessions = 0
        """Sessions registered so far (1 + reconnects)."""
        self.connect_attempts = 0
        """Times a stream was opened (successful or not)."""
        self.output_dropped = 0
        """JobOutput messages dropped: no session was registered, or too many waited to be written."""
        self._queued_output = 0  # JobOutput messages in the outbox
        self._draining = False
        self._drain_deadline_sec = 0.0
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._call: grpc.aio.StreamStreamCall | None = None
        self.rotation = AddressRotation(config.control_addrs)
        """Which address the next session tries (the same TLS credentials and token go to each)."""
        self._credentials = channel_credentials(config)
        pool.may_start_queued = self.may_start_queued
        self._metadata = (("authorization", f"Bearer {config.token}"),) if config.token else None

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start connecting in the background (returns at once; see :attr:`registered`)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="corral-worker-connection")

    async def stop(self) -> None:
        """Drop the stream now and stop reconnecting. Idempotent."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def close(self, within: float = 2.0) -> None:
        """End the stream politely: flush what is queued, half-close, wait for the server's end."""
        self._closing = True
        call, task = self._call, self._task
        if call is not None and task is not None and self.registered.is_set():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(within):
                    await self._flushed.wait()
                    await call.done_writing()
                    # The reader sees the server's end of the stream and the session ends.
                    await asyncio.shield(task)
        await self.stop()

    # -- what the agent and the pool call -----------------------------------------------------------

    def report(self, completion: Completion) -> None:
        """Keep a completion until acknowledged, and send it as soon as the stream allows."""
        result = pb.JobResult(
            attempt=pb.AttemptRef(job_id=completion.job_id, attempt=completion.attempt),
            outcome=_OUTCOMES[completion.outcome],
            result_json=completion.result_json,
            error_code=completion.error_code,
            error_message=completion.error_message,
            started_at=completion.started_at,
            finished_at=completion.finished_at,
            output=completion.output,
        )
        self._unacked[(completion.job_id, completion.attempt)] = result
        self._all_acked.clear()
        if self.registered.is_set():
            self._pending.append(result)
            self._wake.set()

    def printed(self, job_id: str, attempt: int, offset: int, text: str) -> None:
        """Send what a running attempt printed lately, ``offset`` characters in, if the stream allows
        now; else drop it (counted in :attr:`output_dropped`): live output is not kept for later."""
        if not self.registered.is_set() or self._queued_output >= MAX_QUEUED_OUTPUT:
            self.output_dropped += 1
            return
        self._queued_output += 1
        ref = pb.AttemptRef(job_id=job_id, attempt=attempt)
        self._send(pb.WorkerMessage(output=pb.JobOutput(attempt=ref, offset=offset, text=text)))

    def begin_drain(self, deadline_sec: float) -> None:
        """Hand back every assignment from now on and tell the control plane (now and on re-register)."""
        self._draining = True
        self._drain_deadline_sec = deadline_sec
        if self.registered.is_set():
            self._send(pb.WorkerMessage(draining=pb.Draining(deadline_sec=deadline_sec)))

    async def wait_acked(self, within: float) -> bool:
        """Wait until every result sent so far was acknowledged; False if ``within`` seconds passed."""
        try:
            await asyncio.wait_for(self._all_acked.wait(), within)
        except TimeoutError:
            return False
        return True

    @property
    def unacked(self) -> int:
        """Results not yet acknowledged."""
        return len(self._unacked)

    def unacked_results(self) -> list[str]:
        """The results not yet acknowledged, for people: ``"<job_id> attempt <n> <OUTCOME>"`` each."""
        return [
            f"{job_id} attempt {attempt} {pb.JobResult.Outcome.Name(result.outcome)}"
            for (job_id, attempt), result in self._unacked.items()
        ]

    # -- sessions ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        rotation = self.rotation
        while not self._closing:
            address = rotation.current
            logger.info(WORKER_CONNECTING, extra={"control_addr": address, "retry": rotation.retry})
            sessions = self.sessions
            self.connect_attempts += 1
            event = WORKER_DISCONNECTED
            level = logging.INFO
            failure: BaseException | None = None
            try:
                await self._session(address)
                reason = "stream ended"
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
                if exc.code() in _REFUSALS:  # not the network: somebody has to change something
                    event, level = WORKER_REFUSED, logging.ERROR
            except (TimeoutError, ConnectionError, asyncio.InvalidStateError, ProtocolError, Stalled) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            except FilesShort as exc:
                reason, event, level = str(exc), WORKER_FILES_SHORT, logging.ERROR
            except Exception as exc:  # a local fault (a file it reads), or a bug: it must not end the loop,
                # or the worker would run on and never connect again
                reason, level, failure = f"{type(exc).__name__}: {exc}", logging.ERROR, exc
            finally:
                self.registered.clear()
                self._pending.clear()
                self._call = None
            if self._closing:
                return
            rotation.ended(registered=self.sessions > sessions)
            extra = {"control_addr": address, "reason": reason, "retry": rotation.retry}
            logger.log(level, event, extra=extra, exc_info=failure)
            await asyncio.sleep(rotation.delay(self._config.reconnect_max_sec, self._rng))

    async def _session(self, address: str) -> None:
        if (spare := open_files.spare()) < open_files.CONNECT_RESERVE:
            raise FilesShort(spare)
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.secure_channel(address, self._credentials, options=_CHANNEL_OPTIONS)
        async with channel:
            call = pb_grpc.WorkerServiceStub(channel).Connect(metadata=self._metadata)
            self._call = call
            try:
                async with asyncio.timeout(REGISTER_TIMEOUT_SEC):
                    self._heard_at = asyncio.get_running_loop().time()
                    await call.write(self._register_message())
                    first = await call.read()
                if first is grpc.aio.EOF or first.WhichOneof("msg") != "registered":
                    raise ProtocolError(f"expected Registered first, got {_kind(first)}")
                self._on_registered(first.registered, address)
                tasks = [
                    asyncio.create_task(self._reader(call)),
                    asyncio.create_task(self._writer(call)),
                    asyncio.create_task(self._heartbeats()),
                    asyncio.create_task(self._watchdog()),
                ]
                try:
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                for task in done:
                    if (exc := task.exception()) is not None:
                        raise exc
            finally:
                call.cancel()

    def _register_message(self) -> pb.WorkerMessage:
        config = self._config
        attempts = self._pool.attempts()
        return pb.WorkerMessage(
            register=pb.Register(
                worker_id=config.worker_id,
                threads=config.threads,
                slots=config.slots,
                gpus=len(config.gpus),
                memory_mb=config.memory_mb,
                labels=dict(config.labels),
                hostname=socket.gethostname(),
                pid=os.getpid(),
                version=_version(),
                running=[pb.AttemptRef(job_id=job_id, attempt=attempt) for job_id, attempt, _ in attempts],
                running_threads=[threads for _, _, threads in attempts],
                job_types=self._job_types,
                finished=[pb.AttemptRef(job_id=job_id, attempt=attempt) for job_id, attempt in self._unacked],
                registered_since=self.registered_since,
            )
        )

    def _on_registered(self, registered: pb.Registered, address: str) -> None:
        for ref in registered.rejected:
            self._pool.kill(ref.job_id, ref.attempt, None)
        self.heartbeat_interval_sec = registered.heartbeat_interval_sec
        self.heartbeat_timeout_sec = registered.heartbeat_timeout_sec
        if not self.registered_since:
            self.registered_since = registered.registered_at
        self._ticked_at = asyncio.get_running_loop().time()
        self._stalled = False
        self.sessions += 1
        self.output_dropped += self._queued_output  # output of the broken session is not resent
        self._queued_output = 0
        self._outbox.clear()
        self._pending = list(self._unacked.values())
        if self._draining:
            self._outbox.append(pb.WorkerMessage(draining=pb.Draining(deadline_sec=self._drain_deadline_sec)))
        self.registered.set()
        self._wake.set()
        self._pool.start_queued()  # what waited for a runner and was held back (may_start_queued), now kept
        logger.info(
            WORKER_REGISTERED,
            extra={
                "worker_id": self._config.worker_id,
                "control_addr": address,
                "session": self.sessions,
                "heartbeat_interval_sec": registered.heartbeat_interval_sec,
                "adopted": len(registered.adopted),
                "rejected": len(registered.rejected),
                "resent": len(self._pending),
            },
        )

    async def _reader(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            if message.HasField("ack"):
                unacked = self._unacked
                for ref in message.ack.attempts:
                    unacked.pop((ref.job_id, ref.attempt), None)
                if not unacked:
                    self._all_acked.set()
            if message.HasField("assign"):
                self._on_assign(message.assign)
                if self._stalled:
                    raise Stalled(self.heartbeat_timeout_sec)
            kind = message.WhichOneof("msg")
            if kind == "cancel":
                ref = message.cancel.attempt
                self._pool.kill(ref.job_id, ref.attempt, Outcome.CANCELLED)
            elif kind == "drain":
                if self._on_drain is not None:
                    self._on_drain(message.drain.deadline_sec)
            elif kind == "registered":
                self.heartbeat_interval_sec = message.registered.heartbeat_interval_sec
                self.heartbeat_timeout_sec = message.registered.heartbeat_timeout_sec
                for ref in message.registered.rejected:
                    self._pool.kill(ref.job_id, ref.attempt, None)

    def _on_assign(self, assign: pb.Assign) -> None:
        now = time.time()
        pool = self._pool
        stalled = self._stood_still()
        for a in assign.assignments:
            if self._draining or stalled:
                why = "worker is draining" if self._draining else "worker stood still past the heartbeat timeout"
                self.report(Completion(a.job_id, a.attempt, Outcome.HANDED_BACK, "", "HANDED_BACK", why, now, now))
                continue
            if (a.job_id, a.attempt) in self._unacked:
                continue  # already finished here; its result is on its way
            deadline = now + a.timeout_sec if a.timeout_sec > 0 else None
            pool.submit(
                JobSpec(
                    a.job_id, a.attempt, a.type, a.payload_json or "{}", a.threads or 1, deadline, a.gpus, a.timeout_sec
                )
            )

    async def _writer(self, call: grpc.aio.StreamStreamCall) -> None:
        outbox = self._outbox
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._flushed.clear()
            lingered = False
            while outbox or self._pending:
                if outbox:
                    message = outbox.popleft()
                    kind = message.WhichOneof("msg")
                    if kind == "output":
                        self._queued_output -= 1
                    await self._write(call, message, heard=kind == "heartbeat")
                    continue
                if not lingered:
                    await self._linger()
                    lingered = True
                    continue  # what the outbox got meanwhile goes first: an attempt's output before its result
                lingered = False
                batch, self._pending = _cut(self._pending)
                await self._write(call, pb.WorkerMessage(results=pb.Results(results=batch)), heard=True)
            self._flushed.set()

    async def _linger(self) -> None:
        """Wait (at most RESULTS_LINGER_SEC, or SHORT_JOB_LINGER_SEC after a short job) while other jobs
        still run, so their results join this batch."""
        if RESULTS_LINGER_SEC <= 0 or self._closing:
            return
        loop = asyncio.get_running_loop()
        first = self._pending[0] if self._pending else None
        short = first is not None and first.finished_at - first.started_at < SHORT_JOB_LINGER_SEC
        deadline = loop.time() + (SHORT_JOB_LINGER_SEC if short else RESULTS_LINGER_SEC)
        while self._pool.busy > 0 and not self._outbox and not self._closing:
            if short and not self._pool.started_since(time.time() - SHORT_JOB_LINGER_SEC):
                break  # what still runs has run longer than a short job: its results are not coming soon
            left = deadline - loop.time()
            if left <= 0:
                return
            self._wake.clear()
            timer = loop.call_later(left, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()
        self._wake.set()  # re-arm for whatever arrived meanwhile

    async def _write(self, call: grpc.aio.StreamStreamCall, message: pb.WorkerMessage, heard: bool) -> None:
        """Write ``message``; one the control plane counts as a sign of life (``heard``) first ends a session
        that outlived a stand-still (:class:`Stalled`), which the write would hide, and then notes its time."""
        if heard and self._stood_still():
            raise Stalled(self.heartbeat_timeout_sec)
        at = asyncio.get_running_loop().time()
        await call.write(message)
        if heard:
            self._heard_at = at

    def _stood_still(self) -> bool:
        """Whether this session outlived a stand-still longer than the heartbeat timeout (see the module):
        the watchdog's last tick, or the last write the control plane counts as a sign of life, is older."""
        if not self._stalled and self.heartbeat_timeout_sec > 0:
            silent = asyncio.get_running_loop().time() - min(self._ticked_at, self._heard_at)
            if silent > self.heartbeat_timeout_sec:
                self._stalled = True
                self.stalls += 1
                logger.warning(
                    WORKER_STALLED,
                    extra={"worker_id": self._config.worker_id, "seconds": round(silent, 3)},
                )
        return self._stalled

    def may_start_queued(self) -> bool:
        """Whether the pool may start an attempt that waited for a runner process: not once this session
        outlived a stand-still, nor while no sign of life reached the control plane for the heartbeat timeout
        (it may have counted the worker lost and given the attempt to another). The attempt stays queued
        and is listed when the worker registers again; the control plane keeps or kills it."""
        if self.registered.is_set():
            return not self._stood_still()
        timeout = self.heartbeat_timeout_sec
        silent = asyncio.get_running_loop().time() - self._heard_at
        return not self._stalled and not (timeout > 0 and self.sessions and silent > timeout)

    async def _watchdog(self) -> None:
        """Tick a few times per heartbeat timeout; end the session (:class:`Stalled`) once it outlived a
        stand-still longer than the timeout."""
        loop = asyncio.get_running_loop()
        while True:
            timeout = self.heartbeat_timeout_sec
            await asyncio.sleep(max(0.05, timeout / 4) if timeout > 0 else 1.0)
            if self._stood_still():
                raise Stalled(self.heartbeat_timeout_sec)
            self._ticked_at = loop.time()

    async def _heartbeats(self) -> None:
        interval = self.heartbeat_interval_sec if self.heartbeat_interval_sec > 0 else 5.0
        while True:
            await asyncio.sleep(interval)
            running = [pb.AttemptRef(job_id=j, attempt=a) for j, a, _ in self._pool.attempts()]
            self._send(pb.WorkerMessage(heartbeat=pb.Heartbeat(running=running)))
            logger.debug(WORKER_HEARTBEAT, extra={"worker_id": self._config.worker_id, "running": len(running)})

    def _send(self, message: pb.WorkerMessage) -> None:
        self._outbox.append(message)
        self._wake.set()


def channel_credentials(config: WorkerConfig) -> grpc.ChannelCredentials | None:
    """TLS credentials from the config's CA and client certificate files, or None for plaintext."""
    if not config.tls:
        return None

    def read(path: str) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(read(config.tls_ca), read(config.tls_key), read(config.tls_cert))


class ProtocolError(Exception):
    """Raised when the control plane breaks the stream's protocol (no Registered first)."""


class FilesShort(Exception):
    """Raised instead of opening a channel when too few open files are left for it (gRPC would abort
    the whole worker, its running jobs with it)."""

    def __init__(self, spare: int) -> None:
        soft = open_files.soft_limit()
        super().__init__(
            f"{spare} open files left of the limit of {soft} (RLIMIT_NOFILE), fewer than the "
            f"{open_files.CONNECT_RESERVE} a connection may take: waiting for some to close"
        )


class Stalled(Exception):
    """Raised to end a session that outlived a stand-still of the worker past the heartbeat timeout."""

    def __init__(self, timeout_sec: float) -> None:
        super().__init__(f"stood still past the heartbeat timeout ({timeout_sec:g} s)")


def _cut(results: list[pb.JobResult]) -> tuple[list[pb.JobResult], list[pb.JobResult]]:
    """Split off a first batch of at most RESULTS_BATCH_BYTES (or a single result); the rest waits for the
    next message."""
    size = 0
    for i, result in enumerate(results):
        # Its whole encoded size: a job's output (up to 1 MiB each) must count, or the results resent
        # after a reconnect outgrow the stream's 64 MiB limit, break it, and are resent for good. The 64
        # bytes cover its tag and length in Results, with room for the message's own around the batch.
        size += result.ByteSize() + 64
        if size > RESULTS_BATCH_BYTES and i > 0:
            return results[:i], results[i:]
    return results, []


def _kind(message: object) -> str:
    if message is grpc.aio.EOF:
        return "end of stream"
    which = getattr(message, "WhichOneof", None)
    return str(which("msg")) if which else type(message).__name__
