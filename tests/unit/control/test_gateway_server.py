"""The Gateway over stand-in servicers: the error table (429 + Retry-After, 500 for bugs), streams
that fail half-way, headers passed on as metadata, request ids, readiness and metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import grpc
import yarl

from control.api import SERVICES
from control.api.interceptors import request_id
from control.api.status import grpc_errors
from control.gateway import Gateway, InProcess, http_routes, protojson
from control.gateway.status import RpcFailure
from control.metrics import Metrics
from corral.errors import InvalidArgument, NotFound, RateLimited
from corral.v1 import jobs_pb2


class FakeJobs:
    """JobService methods that fail on purpose; ``seen`` keeps the metadata of the last call."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    @grpc_errors
    async def SubmitJob(self, request: jobs_pb2.SubmitJobRequest, context: Any) -> jobs_pb2.SubmitJobResponse:
        self.seen = dict(context.invocation_metadata())
        raise RateLimited("over 60 jobs per minute", retry_after=2.2)

    @grpc_errors
    async def GetJob(self, request: jobs_pb2.GetJobRequest, context: Any) -> jobs_pb2.Job:
        raise RuntimeError("a bug")

    @grpc_errors
    async def ListJobs(self, request: jobs_pb2.ListJobsRequest, context: Any) -> jobs_pb2.ListJobsResponse:
        return jobs_pb2.ListJobsResponse(jobs=[jobs_pb2.Job(type=request.type, priority=request.limit)], total=1)

    @grpc_errors
    async def WatchJob(self, request: jobs_pb2.WatchJobRequest, context: Any) -> AsyncIterator[jobs_pb2.JobEvent]:
        yield jobs_pb2.JobEvent(job=jobs_pb2.Job(id=request.id, state=jobs_pb2.Job.RUNNING))
        raise NotFound(f"job {request.id!r} vanished")


Check = Callable[[aiohttp.ClientSession, str, FakeJobs, list[str | None]], Awaitable[None]]


def serve(check: Check) -> None:
    """Run ``check(session, base_url, servicer, readiness)`` against a Gateway on 127.0.0.1:0."""

    async def main() -> None:
        fake = FakeJobs()
        readiness: list[str | None] = ["no worker takes work"]
        gateway = Gateway(
            "127.0.0.1", 0, InProcess({SERVICES[0].full_name: fake}), http_routes(SERVICES),
            lambda: readiness[0], Metrics(), max_body_bytes=1024,
        )  # fmt: skip
        async with gateway, aiohttp.ClientSession() as session:
            await check(session, f"http://127.0.0.1:{gateway.port}", fake, readiness)
        await gateway.stop()  # idempotent

    asyncio.run(main())


def test_rate_limited_is_429_with_retry_after_and_headers_become_metadata() -> None:
    async def check(session: aiohttp.ClientSession, url: str, fake: FakeJobs, _: Any) -> None:
        headers = {"X-Idempotency-Key": "k-1", "X-Request-ID": "r-1", "Authorization": "Bearer t"}
        async with session.post(f"{url}/v1/jobs", json={"type": "noop"}, headers=headers) as resp:
            assert resp.status == 429 and resp.headers["Retry-After"] == "3"
            assert resp.headers["X-Request-ID"] == "r-1"
            body = await resp.json()
        assert body["code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert body["details"][0] == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3s"}
        assert fake.seen == {"x-request-id": "r-1", "idempotency-key": "k-1", "authorization": "Bearer t"}
        async with session.post(f"{url}/v1/jobs", json={}, headers={"X-Idempotency-Key": "ключ"}) as resp:
            assert resp.status == 400 and "X-Idempotency-Key" in (await resp.json())["message"]

    serve(check)


def test_a_bug_is_500_status_json_and_query_params_reach_the_request() -> None:
    async def check(session: aiohttp.ClientSession, url: str, fake: FakeJobs, _: Any) -> None:
        async with session.get(f"{url}/v1/jobs/x") as resp:
            assert resp.status == 500
            assert await resp.json() == {"code": 13, "message": "GetJob failed: RuntimeError", "details": []}
        async with session.get(f"{url}/v1/jobs?type=sleep&limit=9") as resp:
            body = await resp.json()
        assert body["jobs"][0]["type"] == "sleep" and body["jobs"][0]["priority"] == 9 and body["total"] == "1"
        async with session.post(f"{url}/v1/jobs", data=b"x" * 2000) as resp:
            assert resp.status == 400 and "larger than 1024 bytes" in (await resp.json())["message"]

    serve(check)


def test_a_query_that_is_not_utf8_or_an_enum_number_beyond_int32_is_a_400_naming_the_parameter() -> None:
    async def check(session: aiohttp.ClientSession, url: str, fake: FakeJobs, _: Any) -> None:
        # ?type=%ff was decoded to U+FFFD and answered 200; the same byte in the path is a 400
        async with session.get(yarl.URL(f"{url}/v1/jobs?limit=1&type=%ff", encoded=True)) as resp:
            assert resp.status == 400
            body = await resp.json()
        assert body["details"][0]["fieldViolations"][0]["field"] == "type"
        assert body["message"] == "type: is not valid UTF-8 once percent-decoded"
        # ?status=99999999999 was a 400 naming no field ("Value out of range")
        async with session.get(f"{url}/v1/jobs?status=99999999999") as resp:
            assert resp.status == 400
            body = await resp.json()
        assert body["details"][0]["fieldViolations"][0]["field"] == "status[0]"
        async with session.get(yarl.URL(f"{url}/v1/jobs?type=%C3%A9", encoded=True)) as resp:
            assert resp.status == 200 and (await resp.json())["jobs"][0]["type"] == "é"

    serve(check)


def test_a_stream_that_fails_half_way_ends_with_an_error_line() -> None:
    async def check(session: aiohttp.ClientSession, url: str, fake: FakeJobs, _: Any) -> None:
        async with session.get(f"{url}/v1/jobs/j1:watch") as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == "application/x-ndjson"
            lines = [json.loads(line) for line in (await resp.read()).splitlines()]
        assert lines[0]["result"]["job"] == {**lines[0]["result"]["job"], "id": "j1", "state": "RUNNING"}
        assert lines[1] == {"error": {"code": 5, "message": "job 'j1' vanished", "details": []}}

    serve(check)


def test_health_readiness_and_metrics_endpoints() -> None:
    async def check(session: aiohttp.ClientSession, url: str, fake: FakeJobs, readiness: list[str | None]) -> None:
        async with session.get(f"{url}/healthz") as resp:
            assert resp.status == 200 and len(resp.headers["X-Request-ID"]) == 32
        async with session.get(f"{url}/readyz") as resp:
            assert resp.status == 503 and (await resp.json())["reason"] == "no worker takes work"
        readiness[0] = None
        async with session.get(f"{url}/readyz") as resp:
            assert resp.status == 200 and await resp.json() == {"status": "SERVING"}
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
        assert 'corral_http_requests_total{code="503",route="readyz"} 1.0' in text

    serve(check)


def test_request_ids_are_kept_when_usable() -> None:
    assert request_id("abc-123") == "abc-123" and request_id(b"abc") == "abc"
    for bad in (None, "", "with space", "x" * 129, "naïve"):
        made = request_id(bad)
        assert made != bad and len(made) == 32


def test_an_error_that_quotes_text_that_is_not_utf8_is_still_written() -> None:
    # A field name holding a lone surrogate (from a JSON key such as "\ud800") made building the error
    # itself fail, inside the handler of the error: a 500 text/plain instead of the 400.
    failure = RpcFailure.from_error(InvalidArgument("labels.\ud800", "quotes \udfff"))
    body = json.loads(protojson.dumps(failure.to_json()))
    assert failure.http_status == 400 and body["message"] == "labels.\\ud800: quotes \\udfff"
    assert body["details"][0]["fieldViolations"][0] == {"field": "labels.\\ud800", "description": "quotes \\udfff"}
    assert protojson.dumps({"k\ud800": "\udfff"}) == b'{"k\\ud800":"\\udfff"}'  # still JSON, and UTF-8
