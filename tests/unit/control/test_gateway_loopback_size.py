"""CORRAL_GATEWAY_MODE=loopback: a request too large for the channel to send is a 400, not a 429.

Before, gRPC's own client-side refusal (RESOURCE_EXHAUSTED, "CLIENT: Sent message larger than max") went
back as a 429 without Retry-After, as if sending it again could help; in-process, the same request is
a 400 that names the problem."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from control.api import SERVICES
from control.gateway.invoke import Loopback
from control.gateway.rules import Route, http_routes
from control.gateway.status import RpcFailure
from corral.v1 import jobs_pb2

LIMIT = 1024


def _route(name: str) -> Route:
    return next(r for r in http_routes(SERVICES) if r.name == f"JobService.{name}")


class _Jobs:
    """A JobService that counts what reaches it; SubmitJob is rate limited when ``limited``."""

    def __init__(self) -> None:
        self.calls = 0
        self.limited = False

    async def submit(self, request: jobs_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext) -> Any:
        self.calls += 1
        if self.limited:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "submission rate limit")
        return jobs_pb2.SubmitJobResponse()

    async def run_many(
        self, requests: AsyncIterator[jobs_pb2.RunJobsRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.RunJobsEvent]:
        async for request in requests:
            self.calls += 1
            yield jobs_pb2.RunJobsEvent(tag=request.tag)


async def _with_server(check: Any) -> None:
    jobs = _Jobs()
    server = grpc.aio.server()
    handlers = {
        "SubmitJob": grpc.unary_unary_rpc_method_handler(
            jobs.submit,
            request_deserializer=jobs_pb2.SubmitJobRequest.FromString,
            response_serializer=jobs_pb2.SubmitJobResponse.SerializeToString,
        ),
        "RunJobs": grpc.stream_stream_rpc_method_handler(
            jobs.run_many,
            request_deserializer=jobs_pb2.RunJobsRequest.FromString,
            response_serializer=jobs_pb2.RunJobsEvent.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("corral.v1.JobService", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    invoker = Loopback(f"127.0.0.1:{port}", LIMIT)
    try:
        await check(invoker, jobs)
    finally:
        await invoker.close()
        await server.stop(None)


def _large() -> jobs_pb2.SubmitJobRequest:
    request = jobs_pb2.SubmitJobRequest(type="noop")
    request.payload.update({"x": [1] * 200})  # 2,200 bytes encoded: over LIMIT
    return request


def test_a_request_too_large_to_send_is_invalid_argument_and_reaches_nothing() -> None:
    async def check(invoker: Loopback, jobs: _Jobs) -> None:
        with pytest.raises(RpcFailure) as caught:
            await invoker.unary(_route("SubmitJob"), _large(), ())
        assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.http_status == 400
        assert f"over the {LIMIT} bytes a call to the control plane may carry" in caught.value.message
        assert "Retry-After" not in caught.value.headers()
        assert jobs.calls == 0

    asyncio.run(_with_server(check))


def test_a_streamed_message_too_large_to_send_is_invalid_argument() -> None:
    async def requests() -> AsyncIterator[jobs_pb2.RunJobsRequest]:
        yield jobs_pb2.RunJobsRequest(tag="a", job=_large())

    async def check(invoker: Loopback, jobs: _Jobs) -> None:
        with pytest.raises(RpcFailure) as caught:
            async for _ in invoker.stream(_route("RunJobs"), requests(), ()):
                pass
        assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.http_status == 400
        assert f"bytes as protobuf, over the {LIMIT} bytes" in caught.value.message
        assert jobs.calls == 0

    asyncio.run(_with_server(check))


def test_the_servers_own_resource_exhausted_is_still_a_429() -> None:
    async def check(invoker: Loopback, jobs: _Jobs) -> None:
        jobs.limited = True
        with pytest.raises(RpcFailure) as caught:
            await invoker.unary(_route("SubmitJob"), jobs_pb2.SubmitJobRequest(type="noop"), ())
        assert caught.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert caught.value.http_status == 429
        assert jobs.calls == 1

    asyncio.run(_with_server(check))
