"""JobServicer: a thin adapter from corral.v1.JobService to the Scheduler.

Each call about one job first checks that the caller may see it (control.access): someone else's job
is NOT_FOUND, as a missing one is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable

import grpc
from google.protobuf import struct_pb2

from control.admission import Submission, validate, validate_batch
from control.admission.validation import MAX_TYPE, check_labels, check_text
from control.api import convert
from control.api.audited import audited
from control.api.run_jobs import RunJobsStream
from control.api.status import grpc_errors
from control.audit import AuditLog
from control.auth import Authenticator, Role
from control.identity import PRINCIPAL, client_identity
from control.jobs import JobRecord, JobState
from control.registry import WorkerState
from control.scheduler import Scheduler
from control.selection import JobSelection
from control.turns import in_turns
from corral.errors import InvalidArgument, Unauthenticated
from corral.job_ids import watched_ids
from corral.limits import MAX_CANCELLED_PER_CALL, MAX_ERROR_CODE, MAX_RETRIED_PER_CALL
from corral.v1 import jobs_pb2

MAX_LIST = 1000
MAX_OWNER = 64
"""No client token's name is longer (control.auth)."""
RECHECK_SEC = 1.0
"""How often a stream checks again, before an event, that its credentials still pass (see
:meth:`JobServicer._passing`)."""
OFF_LOOP_BYTES = 64 << 10
"""A submission whose payloads take more than this encoded is converted and checked on a worker thread,
off the event loop that every other call and every worker's heartbeats share: converting a payload costs
about 0.15 s a MB of it encoded (64 KiB, about 10 ms), and making the answer's copy about as much."""


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return ""


def _refuse_call_key(context: grpc.aio.ServicerContext, instead: str) -> None:
    """Refuse an ``idempotency-key`` in the metadata of a call that submits many jobs: one key cannot name
    each of them, and a key left unread would let a retried call make every job twice."""
    if _metadata(context, "idempotency-key"):
        raise InvalidArgument("idempotency-key", f"names one job: {instead}")


class JobServicer:
    """corral.v1.JobService."""

    def __init__(self, scheduler: Scheduler, audit: AuditLog | None = None, auth: Authenticator | None = None) -> None:
        self.s = scheduler
        self.audit = audit
        """Where cancels and retries are recorded (None: nowhere)."""
        self.auth = auth
        """What checked each call's credentials (None: nothing needs any); RunJobs checks them again per job."""

    @grpc_errors
    async def SubmitJob(
        self, request: jobs_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.SubmitJobResponse:
        """Admit, store and queue one job owned by the caller; answers it once committed. The ``idempotency-key``
        metadata stands in for an empty ``idempotency_key`` (and must equal a given one); a replayed key answers the
        job it made."""
        sub = await self._submission(request, _metadata(context, "idempotency-key"))
        (job,) = await self.s.intake.submit([sub], client=self._client(context), owner=PRINCIPAL.get() or "")
        return jobs_pb2.SubmitJobResponse(job=await self._answer(job))

    @grpc_errors
    async def SubmitJobs(
        self, request: jobs_pb2.SubmitJobsRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.SubmitJobsResponse:
        """Submit a batch in one transaction, all of it or none; answers the jobs in request order. An error in one job
        names its place (``jobs[3].payload``). An ``idempotency-key`` in the call's metadata is INVALID_ARGUMENT: it
        would name every job of the batch."""
        _refuse_call_key(context, "in a SubmitJobs batch, give each job its own jobs[i].idempotency_key")
        size = request.ByteSize()
        limit = self.s.limits.max_payload_bytes
        if size > limit * convert.ENCODED_PER_JSON_BYTE + convert.ENCODED_SLACK_BYTES:  # one job's may be too large
            async for start, chunk in in_turns(request.jobs):
                for i, r in enumerate(chunk, start):
                    convert.check_encoded_payload(r.payload, limit, f"jobs[{i}].payload")
        if size > OFF_LOOP_BYTES:
            subs = await asyncio.to_thread(self._checked_batch, request)
        else:
            subs = []
            async for start, chunk in in_turns(request.jobs):
                subs += _submissions(chunk, start)
        jobs = await self.s.intake.submit(subs, batch=True, client=self._client(context), owner=PRINCIPAL.get() or "")
        answer = jobs_pb2.SubmitJobsResponse()
        payloads: list[struct_pb2.Struct | None]
        if size > OFF_LOOP_BYTES:  # the payloads made off the loop too (the records' other fields may change)
            payloads = await asyncio.to_thread(lambda: [convert.payload_struct(j.payload_json) for j in jobs])
        else:
            payloads = [None] * len(jobs)
        async for start, done in in_turns(jobs):  # copied into the answer a chunk per turn too: 10,000 took 10 ms
            answer.jobs.extend([convert.job(j, payloads[i]) for i, j in enumerate(done, start)])
        return answer

    def _client(self, context: grpc.aio.ServicerContext) -> str:
        """Who submits, when a per-client rate limit needs to know (else not worked out)."""
        return client_identity(context) if self.s.submit_limits.per_client else ""

    async def _submission(self, request: jobs_pb2.SubmitJobRequest, idempotency_key: str = "") -> Submission:
        """``request`` as a Submission: a payload too large for its JSON to be within the limit is refused
        before it is converted, and a large one is converted and checked off the event loop (intake then
        checks it again on the loop, all but the payload: see ``Submission.payload_checked``)."""
        size = convert.check_encoded_payload(request.payload, self.s.limits.max_payload_bytes, "payload")
        if size <= OFF_LOOP_BYTES:
            return convert.submission(request, idempotency_key)
        return await asyncio.to_thread(self._checked, request, idempotency_key)

    def _checked(self, request: jobs_pb2.SubmitJobRequest, idempotency_key: str) -> Submission:
        """On a worker thread: ``request`` converted and validated. Nothing shared is changed: the
        submission is new, and the catalog is only read (its validator once)."""
        sub = convert.submission(request, idempotency_key)
        validate(sub, self.s.catalog, self.s.limits)
        return sub

    def _checked_batch(self, request: jobs_pb2.SubmitJobsRequest) -> list[Submission]:
        """:meth:`_checked` for a batch, refused in the order intake refuses it (conversion, size, jobs)."""
        subs = _submissions(request.jobs, 0)
        validate_batch(subs, self.s.catalog, self.s.limits)
        return subs

    async def _payload(self, job: JobRecord) -> struct_pb2.Struct | None:
        """The job's payload as its answers carry it, made off the event loop when it is large; None when
        small (:func:`convert.job` makes it then)."""
        if len(job.payload_json) <= OFF_LOOP_BYTES // convert.ENCODED_PER_JSON_BYTE:
            return None
        return await asyncio.to_thread(convert.payload_struct, job.payload_json)

    async def _answer(self, job: JobRecord) -> jobs_pb2.Job:
        """``convert.job(job)``, its payload made off the event loop when it is large."""
        return convert.job(job, await self._payload(job))

    async def _visible(self, job_id: str) -> str:
        """``job_id`` once the caller may see that job (NOT_FOUND otherwise, as for a missing job)."""
        target = convert.target_id(job_id)
        if self.s.access.isolated:
            self.s.access.check_visible(await self.s.get(target), PRINCIPAL.get())
        return target

    @grpc_errors
    async def GetJob(self, request: jobs_pb2.GetJobRequest, context: grpc.aio.ServicerContext) -> jobs_pb2.Job:
        """The job ``id`` names; NOT_FOUND for a missing job and for one the caller may not see."""
        job = await self.s.get(convert.target_id(request.id))
        return convert.job(self.s.access.check_visible(job, PRINCIPAL.get()))

    @grpc_errors
    async def ListJobs(
        self, request: jobs_pb2.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.ListJobsResponse:
        """A page of the jobs that match, with their total: newest first, or with order QUEUE the PENDING jobs in queue
        order with their places. ``limit`` 1..1000 (0: 50). An ``owner`` whose jobs the caller may not see gets an empty
        page, not an error."""
        limit = request.limit or 50
        if not 1 <= limit <= MAX_LIST:
            raise InvalidArgument("limit", f"must be between 1 and {MAX_LIST}, got {limit}")
        if request.offset < 0:
            raise InvalidArgument("offset", f"must be >= 0, got {request.offset}")
        states = []
        for i, value in enumerate(request.status):
            if value not in JobState._value2member_map_:
                raise InvalidArgument(f"status[{i}]", f"unknown state {value}")
            states.append(JobState(value))
        check_text("type", request.type, MAX_TYPE)  # no job type is longer: say so rather than list none
        check_text("owner", request.owner, MAX_OWNER)
        labels = dict(request.labels) if request.labels else None
        if labels:
            check_labels(labels, "labels")
        check_text("error_code", request.error_code, MAX_ERROR_CODE)
        queue_order = request.order == jobs_pb2.ListJobsRequest.QUEUE
        if queue_order:
            if any(state is not JobState.PENDING for state in states):
                raise InvalidArgument(
                    "status", "the queue (order QUEUE) holds PENDING jobs only: leave status empty or PENDING"
                )
            if request.error_code:
                raise InvalidArgument("error_code", "the queue (order QUEUE) is not filtered by error: leave it empty")
        elif request.order != jobs_pb2.ListJobsRequest.NEWEST_FIRST:
            raise InvalidArgument("order", f"unknown order {request.order}")
        # Checked once the request is known to be well formed, so that a bad one is refused whoever it names.
        owners = self.s.access.listed_owners(PRINCIPAL.get(), request.owner)
        if owners is None:  # another's jobs, which this caller may not see
            return jobs_pb2.ListJobsResponse(total=0)
        if queue_order:
            queue = self.s.queue(request.type, limit, request.offset, owners, labels)
            return jobs_pb2.ListJobsResponse(jobs=[convert.queued_job(q) for q in queue.jobs], total=queue.total)
        page = await self.s.list_jobs(
            states, request.type, limit, request.offset, owners, labels, error_code=request.error_code
        )
        return jobs_pb2.ListJobsResponse(jobs=[convert.job(j) for j in page.jobs], total=page.total)

    @grpc_errors
    @audited("job.cancel", lambda request: request.id)
    async def CancelJob(self, request: jobs_pb2.CancelJobRequest, context: grpc.aio.ServicerContext) -> jobs_pb2.Job:
        """Cancel an unfinished job; answers it once the cancel is committed. FAILED_PRECONDITION when it has ended;
        audited as ``job.cancel``."""
        return convert.job(await self.s.actions.cancel(await self._visible(request.id)))

    @grpc_errors
    @audited("job.cancel", lambda request: _selection_text(request), each=lambda answer: answer.ids)
    async def CancelJobs(
        self, request: jobs_pb2.CancelJobsRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.CancelJobsResponse:
        """Cancel the unfinished jobs a selection matches, oldest first, up to ``limit`` (1..10,000; 0: 10,000); answers
        their ids and how many more matched, each audited as ``job.cancel``. A ``status`` of an ended state is
        INVALID_ARGUMENT, and so is a request that narrows nothing without ``all``."""
        states = set()
        for i, value in enumerate(request.status):
            if value not in JobState._value2member_map_:
                raise InvalidArgument(f"status[{i}]", f"unknown state {value}")
            state = JobState(value)
            if state.terminal:
                raise InvalidArgument(
                    f"status[{i}]", f"{state.name} jobs have ended: only SCHEDULED, PENDING or RUNNING"
                )
            states.add(state)
        matching = await self._matching(
            request, MAX_CANCELLED_PER_CALL, frozenset(states), "cancel every unfinished job"
        )
        if matching is None:
            return jobs_pb2.CancelJobsResponse()
        cancelled, remaining = await self.s.actions.cancel_matching(*matching)
        return jobs_pb2.CancelJobsResponse(ids=cancelled, remaining=remaining)

    @grpc_errors
    @audited("job.retry", lambda request: _selection_text(request), each=lambda answer: answer.ids)
    async def RetryJobs(
        self, request: jobs_pb2.RetryJobsRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.RetryJobsResponse:
        """Re-drive the FAILED jobs a selection matches (``error_code`` among its filters), oldest first, up to
        ``limit`` (1..1,000; 0: 1,000), each committed on its own; answers their ids and how many more matched, each
        audited as ``job.retry``."""
        matching = await self._matching(request, MAX_RETRIED_PER_CALL, frozenset(), "re-drive every FAILED job")
        if matching is None:
            return jobs_pb2.RetryJobsResponse()
        retried, remaining = await self.s.actions.retry_matching(*matching)
        return jobs_pb2.RetryJobsResponse(ids=retried, remaining=remaining)

    async def _matching(
        self,
        request: jobs_pb2.CancelJobsRequest | jobs_pb2.RetryJobsRequest,
        max_limit: int,
        states: frozenset[JobState],
        everything: str,
    ) -> tuple[JobSelection, int, list[str] | None, Callable[[JobRecord], object] | None] | None:
        """The jobs a call that changes many names: ``(selection, limit, ids, check)`` for the
        scheduler, ``check`` refusing a named job the caller may not see; None when the caller asked
        for another owner's jobs, none of which it may see. ``everything``: what the call does to
        every job when nothing narrows it, for the error that asks for ``all``.

        Raises:
            InvalidArgument: naming the field and the rule.
            NotFound: a named job that does not exist or that the caller may not see.
        """
        ids = watched_ids(request.ids) if request.ids else None
        limit = request.limit or max_limit
        if not 1 <= limit <= max_limit:
            raise InvalidArgument("limit", f"must be between 1 and {max_limit:,}, got {limit}")
        check_text("type", request.type, MAX_TYPE)
        check_text("owner", request.owner, MAX_OWNER)
        labels = dict(request.labels)
        if labels:
            check_labels(labels, "labels")
        error_code = request.error_code if isinstance(request, jobs_pb2.RetryJobsRequest) else ""
        check_text("error_code", error_code, MAX_ERROR_CODE)
        if not (ids or states or request.type or request.owner or labels or error_code or request.all):
            narrowing = (
                "ids, status, type, owner or labels"
                if isinstance(request, jobs_pb2.CancelJobsRequest)
                else "ids, type, owner, labels or error_code"
            )
            raise InvalidArgument("all", f"must be true to {everything} (no {narrowing} narrow it)")
        principal = PRINCIPAL.get()
        owners = self.s.access.listed_owners(principal, request.owner)
        if owners is None:  # another's jobs, which this caller may not see
            for job in await self.s.get_many(ids or ()):  # named ones it may not see: NOT_FOUND, as missing ones
                self.s.access.check_visible(job, principal)
            return None
        check = None
        if ids is not None and self.s.access.isolated:

            def check(job: JobRecord) -> object:
                return self.s.access.check_visible(job, principal)

        return JobSelection(request.type, frozenset(owners), states, labels, error_code), limit, ids, check

    @grpc_errors
    @audited("job.retry", lambda request: request.id)
    async def RetryJob(self, request: jobs_pb2.RetryJobRequest, context: grpc.aio.ServicerContext) -> jobs_pb2.Job:
        """Re-drive a FAILED job under a fresh attempt count, with what its failure cancelled down the chain; answers it
        once committed. FAILED_PRECONDITION unless it is FAILED; audited as ``job.retry``."""
        return convert.job(await self.s.actions.retry(await self._visible(request.id)))

    @grpc_errors
    async def WatchJob(
        self, request: jobs_pb2.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.JobEvent]:
        """Stream the job now and after each committed change, until it ends (UNAVAILABLE when the control plane stops:
        the job goes on; UNAUTHENTICATED once the stream's credentials no longer pass)."""
        passing = self._passing(context)
        async for job in self.s.feeds.watch(await self._visible(request.id)):
            passing()
            yield jobs_pb2.JobEvent(job=convert.job(job))

    @grpc_errors
    async def WatchJobs(
        self, request: jobs_pb2.WatchJobsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.JobEvent]:
        """Stream many jobs (``ids``: 1 to 10,000, each once): each now, then after every change, until all have ended;
        with ``ends_only``, each one's terminal state only. An id that names no job, or one the caller may not see, is
        NOT_FOUND before any event; UNAUTHENTICATED once the stream's credentials no longer pass."""
        passing = self._passing(context)
        ids = watched_ids(request.ids)
        check = None
        if self.s.access.isolated:
            principal = PRINCIPAL.get()

            def check(job: JobRecord) -> object:
                return self.s.access.check_visible(job, principal)

        async for job in self.s.feeds.watch_many(ids, request.ends_only, check):
            passing()
            yield jobs_pb2.JobEvent(job=convert.job(job))

    @grpc_errors
    async def WatchOutput(
        self, request: jobs_pb2.WatchOutputRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.OutputChunk]:
        """Stream what the job prints, through its retries, until it ends: the end of what it printed so far (an empty
        chunk when nothing yet), then each new piece; an ended job gets its stored output. UNAUTHENTICATED once the
        stream's credentials no longer pass."""
        passing = self._passing(context)
        async for chunk in self.s.feeds.watch_output(await self._visible(request.id)):
            passing()
            yield jobs_pb2.OutputChunk(attempt=chunk.attempt, offset=chunk.offset, text=chunk.text)

    @grpc_errors
    async def RunJob(
        self, request: jobs_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.JobEvent]:
        """Submit one job as :meth:`SubmitJob` does and stream it as :meth:`WatchJob` does, from the job as committed
        (for a replayed key, the job the key made); ending the stream early leaves the job to run. UNAUTHENTICATED once
        the stream's credentials no longer pass (the job goes on)."""
        passing = self._passing(context)
        sub = await self._submission(request, _metadata(context, "idempotency-key"))
        (accepted,) = await self.s.intake.submit([sub], client=self._client(context), owner=PRINCIPAL.get() or "")
        payload = await self._payload(accepted)  # made once for all the events: the payload does not change
        # JobFeeds.watch subscribes before it reads the job: no change after the commit goes unheard.
        async for job in self.s.feeds.watch(accepted.id, budgeted=False):
            passing()
            yield jobs_pb2.JobEvent(job=convert.job(job, payload))

    @grpc_errors
    async def RunJobs(
        self, requests: AsyncIterator[jobs_pb2.RunJobsRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.RunJobsEvent]:
        """Submit a job per request and send each job's events under its request's tag (:class:`RunJobsStream`). An
        ``idempotency-key`` in the call's metadata is INVALID_ARGUMENT: it would name every job of the stream. Each
        request's job is refused UNAUTHENTICATED once the stream's credentials no longer pass (a token removed, a
        login ended, an account deleted), and the stream goes on."""
        _refuse_call_key(context, "on a RunJobs stream, give each job its own job.idempotency_key")
        client, owner = self._client(context), PRINCIPAL.get() or ""
        auth = self.auth if self.auth is not None and self.auth.client_auth else None
        authorization = _metadata(context, "authorization") or None

        async def submit(request: jobs_pb2.SubmitJobRequest) -> JobRecord:
            # The credentials were checked when the stream opened, and a stream stays open for hours: a token
            # removed, a login ended or an account deleted since must not go on submitting in its name.
            if auth is not None and (auth.authenticate(Role.CLIENT, authorization) or "") != owner:
                raise Unauthenticated("the stream's credentials now name another caller: open a new stream")
            (accepted,) = await self.s.intake.submit([await self._submission(request)], client=client, owner=owner)
            return accepted

        async for event in RunJobsStream(self.s, submit).events(requests):
            yield event

    def _passing(self, context: grpc.aio.ServicerContext) -> Callable[[], None]:
        """A check that a long stream calls before each event: it raises Unauthenticated once the credentials
        the stream opened with no longer name its caller (a token removed, a login ended or expired, an
        account deleted), so that a leaked login whose logins were all ended reads nothing more. Checked
        at most every RECHECK_SEC: a WatchJobs of 10,000 jobs would otherwise check each event."""
        auth = self.auth if self.auth is not None and self.auth.client_auth else None
        if auth is None:
            return _always
        authorization = _metadata(context, "authorization") or None
        owner = PRINCIPAL.get() or ""
        checked = time.monotonic()

        def passing() -> None:
            nonlocal checked
            now = time.monotonic()
            if now - checked < RECHECK_SEC:
                return
            checked = now
            if (auth.authenticate(Role.CLIENT, authorization) or "") != owner:
                raise Unauthenticated("the stream's credentials now name another caller: open a new stream")

        return passing

    @grpc_errors
    async def GetStats(self, request: jobs_pb2.GetStatsRequest, context: grpc.aio.ServicerContext) -> jobs_pb2.Stats:
        """Whole-cluster counts of jobs and workers by state, the success rate, the uptime and what each execution rate
        limit holds back; the same for every caller, whatever the visibility (control.access)."""
        counts = self.s.state_counts()
        by_worker_state = {s.name: 0 for s in WorkerState}
        for w in self.s.registry.all():
            by_worker_state[w.state.name] += 1
        done = counts[JobState.SUCCEEDED] + counts[JobState.FAILED]
        return jobs_pb2.Stats(
            queue_depth=counts[JobState.PENDING],
            scheduled=counts[JobState.SCHEDULED],
            running=counts[JobState.RUNNING],
            workers=len(self.s.registry),
            workers_by_state=by_worker_state,
            jobs_by_status={s.name: n for s, n in counts.items()},
            success_rate=counts[JobState.SUCCEEDED] / done if done else 0.0,
            uptime_seconds=time.time() - self.s.started_at,
            dead_letter=counts[JobState.FAILED],
            exec_rate_limits=[
                jobs_pb2.ExecRateLimit(
                    limit=g.rule.target, per_second=g.rule.per_second, burst=g.rule.burst, waiting=g.waiting
                )
                for g in (self.s.exec_limits.gates if self.s.exec_limits is not None else ())
            ],
        )


def _submissions(requests: Iterable[jobs_pb2.SubmitJobRequest], start: int) -> list[Submission]:
    """The jobs of a batch from index ``start`` on, converted; an error names the job (``jobs[3].payload``)."""
    subs = []
    for i, r in enumerate(requests, start):
        try:
            subs.append(convert.submission(r))
        except InvalidArgument as exc:
            raise InvalidArgument(f"jobs[{i}].{exc.field}", exc.rule) from None
    return subs


def _selection_text(request: jobs_pb2.CancelJobsRequest | jobs_pb2.RetryJobsRequest) -> str:
    """What a refused CancelJobs or RetryJobs call asked for, as its audit event's target."""
    parts = [f"{len(request.ids)} ids"] if request.ids else []
    if isinstance(request, jobs_pb2.CancelJobsRequest):
        parts += [f"status={JobState(v).name if v in JobState._value2member_map_ else v}" for v in request.status]
    parts += [f"{name}={value}" for name, value in (("type", request.type), ("owner", request.owner)) if value]
    parts += [f"labels[{key}]={value}" for key, value in sorted(request.labels.items())]
    if isinstance(request, jobs_pb2.RetryJobsRequest) and request.error_code:
        parts.append(f"error_code={request.error_code}")
    return "jobs: " + (", ".join(parts) if parts else "all")


def _always() -> None:
    """The check of a stream when no caller needs credentials."""
