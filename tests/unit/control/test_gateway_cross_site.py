"""The Gateway's refusals of what a web page can make a browser send (over stand-in servicers): a write
whose ``Origin`` is not the server (403, nothing called), a ``Host`` that is not a loopback name on a
loopback bind (421), which binds count as loopback, ``Cache-Control: no-store`` on bridge answers, and
how the connection handler logs a request it cannot read."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from control.api import SERVICES
from control.api.status import grpc_errors
from control.gateway import Gateway, InProcess, http_routes
from control.gateway.connections import HANDLER_ARGS, GuardedSite, HttpLimits
from control.gateway.server import loopback_bind
from control.metrics import Metrics
from corral.v1 import jobs_pb2

PERMISSION_DENIED = 7


class Jobs:
    """Counts the calls that reach the service."""

    def __init__(self) -> None:
        self.calls = 0

    @grpc_errors
    async def SubmitJob(self, request: jobs_pb2.SubmitJobRequest, context: Any) -> jobs_pb2.SubmitJobResponse:
        self.calls += 1
        return jobs_pb2.SubmitJobResponse(job=jobs_pb2.Job(id="j-1", type=request.type))

    @grpc_errors
    async def GetStats(self, request: jobs_pb2.GetStatsRequest, context: Any) -> jobs_pb2.Stats:
        self.calls += 1
        return jobs_pb2.Stats(queue_depth=3)


Check = Callable[[aiohttp.ClientSession, str, int, Jobs], Awaitable[None]]


def serve(bind: str, check: Check) -> None:
    """Run ``check(session, base_url, port, servicer)`` against a Gateway bound to ``bind``, port 0."""

    async def main() -> None:
        jobs = Jobs()
        gateway = Gateway(
            bind, 0, InProcess({SERVICES[0].full_name: jobs}), http_routes(SERVICES), lambda: None, Metrics(), 1024
        )
        async with gateway, aiohttp.ClientSession() as session:
            await check(session, f"http://127.0.0.1:{gateway.port}", gateway.port, jobs)

    asyncio.run(main())


async def refused(resp: aiohttp.ClientResponse, status: int, says: str) -> None:
    assert resp.status == status, await resp.text()
    assert resp.headers["Cache-Control"] == "no-store" and len(resp.headers["X-Request-ID"]) >= 16
    body = await resp.json()
    assert body["code"] == PERMISSION_DENIED and says in body["message"], body


@pytest.mark.parametrize(
    ("bind", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LocalHost", True),
        ("", False),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("corral.internal", False),
    ],
)
def test_which_binds_are_loopback(bind: str, loopback: bool) -> None:
    assert loopback_bind(bind) is loopback


def test_a_write_from_another_origin_is_refused_before_the_service_is_called() -> None:
    async def check(session: aiohttp.ClientSession, url: str, port: int, jobs: Jobs) -> None:
        for origin in ("https://evil.example", "null", f"http://127.0.0.1:{port + 1}", f"https://127.0.0.1:{port}"):
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                headers = {"Origin": origin, "Content-Type": "text/plain"}
                async with session.request(method, f"{url}/v1/jobs", data=b'{"type": "noop"}', headers=headers) as r:
                    await refused(r, 403, "cross-site request refused")
        assert jobs.calls == 0
        # The same origin, and no Origin at all, are served; so is a read from anywhere
        async with session.post(f"{url}/v1/jobs", data=b'{"type": "a"}', headers={"Origin": url}) as r:
            assert r.status == 200 and r.headers["Cache-Control"] == "no-store"
        async with session.post(f"{url}/v1/jobs", data=b'{"type": "b"}', skip_auto_headers=["Content-Type"]) as r:
            assert r.status == 200
        async with session.get(f"{url}/v1/stats", headers={"Origin": "https://evil.example"}) as r:
            assert r.status == 200
        assert jobs.calls == 3

    serve("127.0.0.1", check)


def test_a_host_that_is_not_loopback_is_misdirected_on_a_loopback_bind() -> None:
    async def check(session: aiohttp.ClientSession, url: str, port: int, jobs: Jobs) -> None:
        for path in ("/v1/stats", "/healthz", "/ui", "/"):
            async with session.get(f"{url}{path}", headers={"Host": "rebind.evil.example"}) as r:
                await refused(r, 421, "not a loopback name")
        for host in (f"localhost:{port}", "a.b.localhost", f"[::1]:{port}", "127.0.0.9", "localhost."):
            async with session.get(f"{url}/v1/stats", headers={"Host": host}) as r:
                assert r.status == 200, (host, await r.text())

    serve("127.0.0.1", check)


def test_a_misdirected_host_is_refused_before_100_continue() -> None:
    async def check(session: aiohttp.ClientSession, url: str, port: int, jobs: Jobs) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/jobs HTTP/1.1\r\nHost: rebind.evil.example\r\nExpect: 100-continue\r\nContent-Length: 16\r\n\r\n"
        )
        first = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        assert first.startswith(b"HTTP/1.1 421"), first
        assert jobs.calls == 0

    serve("127.0.0.1", check)


def test_a_wildcard_bind_takes_any_host_but_still_refuses_other_origins() -> None:
    async def check(session: aiohttp.ClientSession, url: str, port: int, jobs: Jobs) -> None:
        async with session.get(f"{url}/v1/stats", headers={"Host": "corral.example.com"}) as r:
            assert r.status == 200
        same = {"Host": "corral.example.com:8080", "Origin": "http://corral.example.com:8080"}
        async with session.post(f"{url}/v1/jobs", data=b'{"type": "a"}', headers=same) as r:
            assert r.status == 200
        other = {"Host": "corral.example.com", "Origin": "http://evil.example"}
        async with session.post(f"{url}/v1/jobs", data=b'{"type": "a"}', headers=other) as r:
            await refused(r, 403, "cross-site request refused")
        assert jobs.calls == 2

    serve("0.0.0.0", check)


# ---- requests the parser cannot read ----------------------------------------------------------------
def test_unreadable_requests_are_one_warning_without_a_traceback_and_server_errors_still_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async def handler(request: web.Request) -> web.Response:
            if request.path == "/bug":
                raise RuntimeError("a bug")
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/{tail:.*}", handler)
        runner = web.AppRunner(app, **HANDLER_ARGS)
        await runner.setup()
        try:
            site = GuardedSite(runner, "127.0.0.1", 0, HttpLimits())
            await site.start()
            port = int(runner.addresses[0][1])
            for data in (
                b"GET / HTTP/1.1\r\nHost: t\r\nX-Foo: " + b"a" * 9000 + b"\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(300)) + b"\r\n",
                b"GET /bug HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            ):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(data)
                answer = await asyncio.wait_for(reader.read(), 10)
                writer.close()
                assert answer.split(b"\r\n")[0].split()[1] in (b"400", b"500"), answer[:200]
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    parse = [r for r in caplog.records if "8190" in r.getMessage() or "LineTooLong" in str(r.exc_info)]
    assert all(r.levelno < logging.ERROR and r.exc_info is None for r in parse), parse
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == ["http_request_unreadable"], warned
    assert "aaaaaaaa" not in caplog.text
    # the handler's bug is still an error with its traceback
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None and "a bug" in str(errors[0].exc_info[1])
