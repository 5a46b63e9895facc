"""The HTTP port's deadlines and cap (control.gateway.connections): their settings, and, in-process, what
a control plane cannot be made to show: a body that the server itself holds back (its buffer full, the
handler not reading yet) is not the client's silence, and an answer has no deadline however slow it is.

tests/integration/test_exhaustion_connections.py has the rest, against a real control plane."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from control.config import ConfigError, ControlConfig
from control.gateway import HttpLimits
from control.gateway.connections import HANDLER_ARGS, GuardedSite, headers_in

DEADLINE = 0.5
LIMITS = HttpLimits(header_timeout_sec=DEADLINE, body_timeout_sec=DEADLINE, max_connections=0)
BIG = 4 << 20
"""A body far past what aiohttp buffers before it stops reading (2 x 64 KiB)."""


# ---- settings ------------------------------------------------------------------------------------------
def test_the_defaults_are_the_configurations_and_the_environment_sets_them() -> None:
    assert HttpLimits.from_config(ControlConfig.from_env({})) == HttpLimits(10.0, 10.0, 1000)
    env = {
        "CORRAL_HTTP_HEADER_TIMEOUT_SEC": "2.5",
        "CORRAL_HTTP_BODY_TIMEOUT_SEC": " 30 ",
        "CORRAL_HTTP_MAX_CONNECTIONS": "0",
    }
    assert HttpLimits.from_config(ControlConfig.from_env(env)) == HttpLimits(2.5, 30.0, 0)


@pytest.mark.parametrize(
    ("var", "raw", "message"),
    [
        ("CORRAL_HTTP_HEADER_TIMEOUT_SEC", "0", "CORRAL_HTTP_HEADER_TIMEOUT_SEC must be > 0, got 0.0"),
        ("CORRAL_HTTP_HEADER_TIMEOUT_SEC", "soon", "CORRAL_HTTP_HEADER_TIMEOUT_SEC must be a number, got 'soon'"),
        ("CORRAL_HTTP_BODY_TIMEOUT_SEC", "-1", "CORRAL_HTTP_BODY_TIMEOUT_SEC must be > 0, got -1.0"),
        ("CORRAL_HTTP_BODY_TIMEOUT_SEC", "inf", "CORRAL_HTTP_BODY_TIMEOUT_SEC must be a finite number, got 'inf'"),
        ("CORRAL_HTTP_MAX_CONNECTIONS", "-1", "CORRAL_HTTP_MAX_CONNECTIONS must be >= 0 (0: no cap), got -1"),
        ("CORRAL_HTTP_MAX_CONNECTIONS", "1.5", "CORRAL_HTTP_MAX_CONNECTIONS must be an integer, got '1.5'"),
    ],
)
def test_bad_values_name_the_variable_and_the_rule(var: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        ControlConfig.from_env({var: raw})


# ---- in-process ----------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def serving(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[int]:
    """``handler`` on POST / behind a :class:`GuardedSite` with :data:`LIMITS`; yields the port."""
    app = web.Application(client_max_size=2 * BIG, middlewares=[headers_in])
    app.router.add_post("/", handler)
    runner = web.AppRunner(app, **HANDLER_ARGS)
    await runner.setup()
    try:
        await GuardedSite(runner, "127.0.0.1", 0, LIMITS).start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


async def past_the_deadline(port: int) -> None:
    """Return once a deadline's length has passed, as the server counts it: a connection opened now and
    left silent is closed at its header deadline, as long as the body's."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), 30) == b""
    finally:
        writer.close()


async def answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The status line and the body of a response (``Connection: close``: up to EOF)."""
    raw = await asyncio.wait_for(reader.read(), 30)
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body


def request(body: bytes) -> bytes:
    return b"POST / HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def test_a_body_the_server_holds_back_is_not_the_clients_silence() -> None:
    async def main() -> None:
        waiting, go = asyncio.Event(), asyncio.Event()

        async def handler(request: web.Request) -> web.Response:
            waiting.set()
            await go.wait()
            return web.Response(text=str(len(await request.read())))

        async with serving(handler) as port:
            # Given a request whose body the handler does not read yet: the server stops reading it
            # once its buffer is full, and the client cannot send the rest
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request(b"x" * BIG))
            await waiting.wait()
            # When that lasts past the body deadline
            await past_the_deadline(port)
            # Then the connection is still there: when the handler reads, it gets the whole body
            go.set()
            await writer.drain()
            assert await answer(reader) == (b"HTTP/1.1 200 OK", str(BIG).encode())
            writer.close()

    asyncio.run(main())


def test_an_answer_slower_than_the_deadlines_is_not_cut() -> None:
    async def main() -> None:
        go = asyncio.Event()

        async def slow(request: web.Request) -> web.Response:
            await request.read()
            await go.wait()
            return web.Response(text="done")

        async with serving(slow) as port:
            # Given a request, all sent, whose answer takes longer than the deadlines
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request(b"{}"))
            await past_the_deadline(port)
            go.set()
            # Then it is answered
            assert await answer(reader) == (b"HTTP/1.1 200 OK", b"done")
            writer.close()

    asyncio.run(main())
