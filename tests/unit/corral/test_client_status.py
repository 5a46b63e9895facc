"""The client's one RpcError -> corral.errors translation, against a real gRPC server on 127.0.0.1.

The fake JobService below aborts GetJob with whatever the job id asks for (``CODE``, ``CODE:rich`` for a
status detail trailer as the control plane always sends, ``CODE:field`` for a BadRequest detail, ``CODE:retry=<s>`` for a RetryInfo detail, ``CODE:after=<s>`` for a retry-after
trailer) and answers ``huge`` with a job larger than a client takes; WatchJob streams PENDING, RUNNING
and, unless the id is ``hang``, SUCCEEDED. A second server of the same service takes and sends messages
of at most SMALL_LIMIT bytes. Both clients are checked against the same cases.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

import corral
from corral import errors
from corral.status import error_from_status
from corral.v1 import jobs_pb2, jobs_pb2_grpc
from tests.support.ports import dead_address

CODES = [
    ("INVALID_ARGUMENT", errors.InvalidArgument),
    ("NOT_FOUND", errors.NotFound),
    ("ALREADY_EXISTS", errors.AlreadyExists),
    ("FAILED_PRECONDITION", errors.FailedPrecondition),
    ("UNAUTHENTICATED", errors.Unauthenticated),
    ("PERMISSION_DENIED", errors.PermissionDenied),
    ("UNAVAILABLE", errors.Unavailable),
    ("DEADLINE_EXCEEDED", errors.DeadlineExceeded),
    ("INTERNAL", errors.Internal),
]


def _detail(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


class FakeJobs(jobs_pb2_grpc.JobServiceServicer):
    """Aborts GetJob as the id says; streams a short life for WatchJob."""

    def GetJob(self, request: jobs_pb2.GetJobRequest, context: grpc.ServicerContext) -> jobs_pb2.Job:
        if request.id == "huge":  # over the clients' 64 MiB, though not over this server's own limit
            return jobs_pb2.Job(id="x" * (64 << 20))
        if request.id == "big":  # over the small server's limit
            return jobs_pb2.Job(id="x" * SMALL_LIMIT)
        name, _, extra = request.id.partition(":")
        code = grpc.StatusCode[name]
        details: list[any_pb2.Any] = []
        trailers: list[tuple[str, str | bytes]] = []
        if extra.startswith("retry="):
            details.append(
                _detail(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=3, nanos=500_000_000)))
            )
        elif extra.startswith("after="):
            trailers.append(("retry-after", extra.removeprefix("after=")))
        elif extra and extra != "rich":
            violation = error_details_pb2.BadRequest.FieldViolation(field=extra, description="must be an integer")
            details.append(_detail(error_details_pb2.BadRequest(field_violations=[violation])))
        if details or extra == "rich":
            status = status_pb2.Status(code=code.value[0], message=f"{name} happened", details=details)
            trailers.append(("grpc-status-details-bin", status.SerializeToString()))
        context.set_trailing_metadata(trailers)
        context.abort(code, f"{name} happened")
        raise AssertionError("abort() raises")

    def WatchJob(self, request: jobs_pb2.WatchJobRequest, context: grpc.ServicerContext) -> Iterator[jobs_pb2.JobEvent]:
        if request.id == "missing":
            context.abort(grpc.StatusCode.NOT_FOUND, "job 'missing' not found")
        for state in (jobs_pb2.Job.PENDING, jobs_pb2.Job.RUNNING):
            yield jobs_pb2.JobEvent(job=jobs_pb2.Job(id=request.id, type="noop", state=state))
        if request.id == "hang":
            done = threading.Event()
            context.add_callback(done.set)
            done.wait(30)
            return
        yield jobs_pb2.JobEvent(job=jobs_pb2.Job(id=request.id, type="noop", state=jobs_pb2.Job.SUCCEEDED))


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    jobs_pb2_grpc.add_JobServiceServicer_to_server(FakeJobs(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


SMALL_LIMIT = 1024
"""Bytes the ``small_address`` server takes in and sends out in one message."""


@pytest.fixture(scope="module")
def small_address() -> Iterator[str]:
    limits = [("grpc.max_receive_message_length", SMALL_LIMIT), ("grpc.max_send_message_length", SMALL_LIMIT)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=limits)
    jobs_pb2_grpc.add_JobServiceServicer_to_server(FakeJobs(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


def _sync_get(address: str, job_id: str) -> None:
    with corral.Client(address, timeout=5) as client:
        client.get(job_id)


def _async_get(address: str, job_id: str) -> None:
    async def go() -> None:
        async with corral.AsyncClient(address, timeout=5) as client:
            await client.get(job_id)

    asyncio.run(go())


GETS = pytest.mark.parametrize("get", [_sync_get, _async_get], ids=["sync", "async"])


@GETS
@pytest.mark.parametrize(("code", "cls"), CODES)
def test_each_status_code_raises_its_class(address: str, get: Any, code: str, cls: type[errors.CorralError]) -> None:
    with pytest.raises(cls) as info:
        get(address, code)
    assert type(info.value) is cls
    assert info.value.code == code
    assert "happened" in info.value.message


@GETS
def test_bad_request_detail_names_the_field(address: str, get: Any) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        get(address, "INVALID_ARGUMENT:payload.a")
    assert (info.value.field, info.value.rule) == ("payload.a", "must be an integer")
    assert str(info.value) == "payload.a: must be an integer"


@GETS
def test_invalid_argument_without_details_keeps_the_message(address: str, get: Any) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        get(address, "INVALID_ARGUMENT")
    assert (info.value.field, info.value.rule) == ("", "INVALID_ARGUMENT happened")


@GETS
def test_retry_after_trailer_gives_the_delay(address: str, get: Any) -> None:
    with pytest.raises(errors.RateLimited) as info:
        get(address, "RESOURCE_EXHAUSTED:after=2.5")
    assert info.value.retry_after == 2.5


@GETS
def test_retry_info_detail_gives_the_delay_without_a_trailer(address: str, get: Any) -> None:
    with pytest.raises(errors.RateLimited) as info:
        get(address, "RESOURCE_EXHAUSTED:retry=")
    assert info.value.retry_after == 3.5


@GETS
@pytest.mark.parametrize("extra", ["", ":rich"])
def test_resource_exhausted_without_a_retry_signal_is_not_rate_limited(address: str, get: Any, extra: str) -> None:
    # Only the control plane's rate limiter says when to try again; a caller that waits and retries on
    # RateLimited (corral demo) looped for ever on any other RESOURCE_EXHAUSTED
    with pytest.raises(errors.CorralError) as info:
        get(address, f"RESOURCE_EXHAUSTED{extra}")
    assert type(info.value) is errors.CorralError
    assert (info.value.code, info.value.message) == ("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED happened")


@GETS
def test_a_request_over_the_servers_message_limit_is_too_large_not_rate_limited(small_address: str, get: Any) -> None:
    with pytest.raises(errors.MessageTooLarge) as info:
        get(small_address, "x" * SMALL_LIMIT)
    assert (info.value.which, info.value.limit) == ("request", SMALL_LIMIT)
    assert info.value.size is not None and info.value.size > SMALL_LIMIT
    assert info.value.code == "RESOURCE_EXHAUSTED" and not isinstance(info.value, errors.RateLimited)
    assert f"the request was too large for one gRPC message: {info.value.size:,} bytes, over the 1,024-byte limit" == (
        info.value.message
    )


@GETS
def test_an_answer_over_the_servers_message_limit_is_too_large(small_address: str, get: Any) -> None:
    with pytest.raises(errors.MessageTooLarge) as info:
        get(small_address, "big")
    assert (info.value.which, info.value.limit) == ("answer", SMALL_LIMIT)
    assert info.value.message.endswith("-byte limit; the request itself was carried out")


@GETS
def test_an_answer_over_the_clients_message_limit_is_too_large(address: str, get: Any) -> None:
    with pytest.raises(errors.MessageTooLarge) as info:
        get(address, "huge")
    assert (info.value.which, info.value.limit) == ("answer", 64 << 20)
    assert info.value.size is not None and info.value.size > 64 << 20


def test_a_refusal_in_a_stream_is_rate_limited_only_with_retry_info() -> None:
    # A RunJobs stream answers a refused submission with a google.rpc.Status: no trailers to read
    retry = _detail(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=2)))
    limited = error_from_status(status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="slow", details=[retry]))
    assert isinstance(limited, errors.RateLimited) and limited.retry_after == 2
    other = error_from_status(status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="full"))
    assert type(other) is errors.CorralError and other.code == "RESOURCE_EXHAUSTED"


@GETS
def test_a_code_without_a_class_is_a_plain_corral_error(address: str, get: Any) -> None:
    with pytest.raises(errors.CorralError) as info:
        get(address, "ABORTED")
    assert type(info.value) is errors.CorralError
    assert info.value.code == "ABORTED"


@GETS
def test_an_unimplemented_method_is_a_corral_error(address: str, get: Any) -> None:
    # The fake serves JobService only: the admin service is UNIMPLEMENTED there.
    with pytest.raises(errors.CorralError) as info, corral.Client(address) as client:
        client.workers()
    assert info.value.code == "UNIMPLEMENTED"


@pytest.fixture
def closed_address() -> str:
    return dead_address()


@GETS
def test_an_unreachable_server_is_unavailable(closed_address: str, get: Any) -> None:
    with pytest.raises(errors.Unavailable) as info:
        get(closed_address, "x")
    assert not info.value.answered  # nobody answered: the CLI says it cannot reach the control plane


@GETS
def test_an_error_the_server_sent_says_it_answered(address: str, get: Any) -> None:
    # The control plane's own UNAVAILABLE (stopping, its store failing): the CLI printed "cannot reach
    # the control plane" for it, which sent the operator to look at the network
    with pytest.raises(errors.Unavailable) as info:
        get(address, "UNAVAILABLE:rich")
    assert info.value.answered and info.value.message == "UNAVAILABLE happened"


def test_sync_watch_yields_every_change_and_wait_returns_the_terminal_job(address: str) -> None:
    with corral.Client(address) as client:
        states = [job.state.name for job in client.watch("j1")]
        assert states == ["PENDING", "RUNNING", "SUCCEEDED"]
        assert client.wait("j1", timeout=10).state is corral.JobState.SUCCEEDED
        with pytest.raises(errors.NotFound):
            list(client.watch("missing"))


def test_sync_wait_times_out_with_deadline_exceeded(address: str) -> None:
    with corral.Client(address) as client, pytest.raises(errors.DeadlineExceeded) as info:
        client.wait("hang", timeout=0.5)
    assert "hang" in info.value.message


def test_async_watch_and_wait_behave_like_the_sync_ones(address: str) -> None:
    async def go() -> None:
        async with corral.AsyncClient(address) as client:
            states = [job.state.name async for job in client.watch("j1")]
            assert states == ["PENDING", "RUNNING", "SUCCEEDED"]
            assert (await client.wait("j1", timeout=10)).state is corral.JobState.SUCCEEDED
            with pytest.raises(errors.DeadlineExceeded):
                await client.wait("hang", timeout=0.5)
            with pytest.raises(errors.NotFound):
                [job async for job in client.watch("missing")]

    asyncio.run(go())
