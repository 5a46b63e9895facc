"""corral.Client and corral.AsyncClient against a real control plane and worker on 127.0.0.1.

Every test runs twice, once per client: the async one is driven through a small adapter that runs each
coroutine on one event loop, so both are held to the same expectations (results and error classes).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import corral
from corral import JobSpec, JobState, errors
from tests.conftest import ControlProc


class AsyncAsSync:
    """Calls an AsyncClient's methods on one event loop, with the blocking client's signatures."""

    def __init__(self, address: str) -> None:
        self._runner = asyncio.Runner()
        self._client = corral.AsyncClient(address, timeout=10)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "watch":

                async def collect() -> list[corral.Job]:
                    return [job async for job in method(*args, **kwargs)]

                return iter(self._runner.run(collect()))
            return self._runner.run(method(*args, **kwargs))

        return call

    def close(self) -> None:
        self._runner.run(self._client.close())
        self._runner.close()


@pytest.fixture
def served(control_plane: ControlProc, spawn_worker: Any) -> ControlProc:
    spawn_worker(control_plane, threads=2, imports=())  # the built-in job types only
    return control_plane


@pytest.fixture(params=["sync", "async"])
def client(request: pytest.FixtureRequest, served: ControlProc) -> Iterator[Any]:
    c: Any = corral.Client(served.address, timeout=10) if request.param == "sync" else AsyncAsSync(served.address)
    yield c
    c.close()


def test_submit_wait_get_and_list(client: Any) -> None:
    # Given a job submitted with every option
    job = client.submit(
        "add_numbers", {"a": 2, "b": 40}, name="answer", priority=5, thread_demand=1, labels={"suite": "client"}
    )
    assert job.state in (JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED)
    assert (job.name, job.priority, job.labels, job.payload) == ("answer", 5, {"suite": "client"}, {"a": 2, "b": 40})

    # When it is waited for
    done = client.wait(job.id, timeout=30)

    # Then it succeeded with the result, and get and list agree
    assert done.state is JobState.SUCCEEDED and done.result == {"sum": 42} and isinstance(done.result["sum"], int)
    assert done.attempts == 1 and done.worker_id and done.finished_at is not None and done.is_terminal
    assert client.get(job.id) == done
    page = client.list(status=[JobState.SUCCEEDED], type="add_numbers")
    assert page.total == 1 and [j.id for j in page.jobs] == [job.id]
    assert client.list(status=["failed"]).total == 0


def test_watch_follows_a_job_to_its_end(client: Any) -> None:
    job = client.submit("sleep", {"seconds": 0.3})
    states = [update.state for update in client.watch(job.id)]
    assert states[-1] is JobState.SUCCEEDED
    assert JobState.RUNNING in states or states == [JobState.SUCCEEDED]


def test_submit_many_scheduled_at_and_cancel(client: Any) -> None:
    later = datetime.now(UTC) + timedelta(minutes=10)
    jobs = client.submit_many(
        [JobSpec("noop", scheduled_at=later), JobSpec("noop", scheduled_at=time.time() + 600), JobSpec("noop")]
    )
    assert [j.state for j in jobs[:2]] == [JobState.SCHEDULED, JobState.SCHEDULED]
    assert abs((jobs[0].scheduled_at - later).total_seconds()) < 0.001
    cancelled = client.cancel(jobs[0].id)
    assert cancelled.state is JobState.CANCELLED
    with pytest.raises(errors.FailedPrecondition):
        client.cancel(jobs[0].id)
    assert client.wait(jobs[2].id, timeout=30).state is JobState.SUCCEEDED


def test_retry_re_drives_a_failed_job(client: Any) -> None:
    job = client.submit("failing", {"message": "no luck"}, max_attempts=1)
    failed = client.wait(job.id, timeout=30)
    assert failed.state is JobState.FAILED
    assert failed.error == corral.JobError("ERROR", "no luck")
    with pytest.raises(errors.FailedPrecondition):
        client.retry(client.submit("noop", scheduled_at=time.time() + 600).id)
    retried = client.retry(job.id)
    assert retried.state in (JobState.PENDING, JobState.RUNNING, JobState.SCHEDULED, JobState.FAILED)
    again = client.wait(job.id, timeout=30)
    assert again.state is JobState.FAILED and again.attempts >= 1


def test_idempotency_keys(client: Any) -> None:
    key = f"k-{uuid.uuid4()}"
    first = client.submit("noop", idempotency_key=key)
    assert client.submit("noop", idempotency_key=key).id == first.id
    with pytest.raises(errors.AlreadyExists):
        client.submit("sleep", {"seconds": 1}, idempotency_key=key)


def test_errors_are_the_shared_classes(client: Any) -> None:
    with pytest.raises(errors.NotFound):
        client.get("no-such-job")
    with pytest.raises(errors.InvalidArgument) as info:
        client.submit("add_numbers", {"a": "one", "b": 2})
    assert info.value.field == "payload.a"
    with pytest.raises(errors.InvalidArgument) as info:
        client.submit("no_such_type")
    assert info.value.field == "type"
    with pytest.raises(errors.InvalidArgument) as info:
        client.submit("noop", timeout_sec=-1)
    assert info.value.field == "timeout_sec"
    slow = client.submit("sleep", {"seconds": 5})
    with pytest.raises(errors.DeadlineExceeded):
        client.wait(slow.id, timeout=0.3)
    client.cancel(slow.id)


def test_a_submission_over_the_message_limit_is_too_large_not_rate_limited(client: Any) -> None:
    # Given a batch larger than the control plane takes in one gRPC message (64 MiB)
    specs = [JobSpec("noop", {"filler": "x" * (33 << 20)}) for _ in range(2)]
    # When it is submitted, then the error says so; before, it was a RateLimited, and a caller that
    # waited and sent it again (corral demo) did so for ever
    with pytest.raises(errors.MessageTooLarge) as info:
        client.submit_many(specs)
    assert (info.value.which, info.value.limit) == ("request", 64 << 20)
    assert not isinstance(info.value, errors.RateLimited)
    assert "the request was too large for one gRPC message" in info.value.message
    assert client.list().total == 0


def test_stats_and_workers(client: Any) -> None:
    client.wait(client.submit("noop").id, timeout=30)
    stats = client.stats()
    assert stats.workers == 1 and stats.jobs_by_status.get("SUCCEEDED") == 1 and stats.uptime_seconds > 0
    (worker,) = client.workers()
    assert worker.threads == 2 and worker.state in (corral.WorkerState.AVAILABLE, corral.WorkerState.BUSY)
    assert worker.jobs_completed >= 1
    autoscaler = client.autoscaler()
    assert isinstance(autoscaler, corral.AutoscalerStatus)


def test_drain_worker(client: Any) -> None:
    (worker,) = client.workers()
    drained = client.drain_worker(worker.id)
    assert drained.id == worker.id
    with pytest.raises(errors.NotFound):
        client.drain_worker("no-such-worker")


def test_a_closed_client_opens_new_channels_at_its_next_call(served: ControlProc) -> None:
    # Given each client, closed after a call
    sync = corral.Client(served.address, timeout=10)
    assert sync.submit("noop").state is not None
    sync.close()
    # When it is called again, Then the call is served on a new channel (before, the blocking client raised
    # a bare ValueError, "Cannot invoke RPC on closed channel!", while the async one reopened)
    assert sync.wait(sync.submit("add_numbers", {"a": 1, "b": 2}).id, timeout=30).result == {"sum": 3}
    sync.close()
    sync.close()

    async def twice() -> dict[str, Any] | None:
        aio = corral.AsyncClient(served.address, timeout=10)
        await aio.submit("noop")
        await aio.close()
        job = await aio.submit("add_numbers", {"a": 1, "b": 2})
        done = await aio.wait(job.id, timeout=30)
        await aio.close()
        return done.result

    assert asyncio.run(twice()) == {"sum": 3}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_unreachable_control_plane_is_unavailable(kind: str, control_plane: ControlProc) -> None:
    address = control_plane.address
    control_plane.stop()
    c: Any = corral.Client(address, timeout=5) if kind == "sync" else AsyncAsSync(address)
    try:
        with pytest.raises(errors.Unavailable):
            c.stats()
    finally:
        c.close()
