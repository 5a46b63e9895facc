"""The bare gRPC floor of one submit -> watch round trip on this machine.

A client that waits for its job makes two calls: a unary ``SubmitJob`` and a server-streaming
``WatchJob``. Here a server in a process of its own (grpc.aio on the same event loop and transport
settings as the control plane) answers the same shapes with no work at all: an echo, a stream of one
message, and a bidirectional stream that echoes each message. The median time of one unary plus one
stream call (and of one stream call alone, the shape of RunJob, and of one message on a stream kept
open, the shape of ``Client.run`` on its kept RunJobs stream), from the same kind of client the
latency benchmark uses, is the part of a round trip
that is gRPC and the operating system's, not Corral's; on a small virtual machine it is most of it.
``python -m bench.grpc_floor`` prints it, and the bare server's CPU per call.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import NamedTuple

import grpc  # after corral.transport, which the bench package imports first: the control plane's settings

from bench.cluster import cpu_seconds_of
from corral.client import SYNC_CHANNEL_OPTIONS

_SERVICE = "corral.bench.Floor"
_PAYLOAD = b"x" * 200  # about a Job message


def _ident(data: bytes) -> bytes:
    return data


async def _serve(port_file: Path) -> None:
    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        yield request

    async def echo(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    server = grpc.aio.server()
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, _ident, _ident),
        "Stream": grpc.unary_stream_rpc_method_handler(stream, _ident, _ident),
        "Echo": grpc.stream_stream_rpc_method_handler(echo, _ident, _ident),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    os.replace(tmp, port_file)
    await server.wait_for_termination()


class Floor(NamedTuple):
    """What the bare server gave."""

    two_calls_ms: float
    """Median of one unary call plus one single-message stream (a SubmitJob, then a WatchJob)."""
    one_call_ms: float
    """Median of one single-message stream alone (a RunJob)."""
    kept_stream_ms: float
    """Median of one message there and back on a bidirectional stream that stays open, fed from a
    queue as a blocking client feeds its kept RunJobs stream (``corral.run_streams``)."""
    server_cpu_us_per_call: float
    """The bare server's CPU (every thread) per call, averaged over the three calls of each round
    (the kept stream's messages are sent after them): what grpc.aio itself costs a server on this
    machine for each call, before any work of its own."""


@contextlib.contextmanager
def bare_server() -> Iterator[tuple[subprocess.Popen[bytes], grpc.Channel]]:
    """A bare server in a process of its own, and a blocking channel to it with the options the
    benchmarks' own clients use (corral.Client's), so that what is timed through it is their floor."""
    with tempfile.TemporaryDirectory(prefix="corral-floor-") as tmp:
        port_file = Path(tmp) / "port"
        server = subprocess.Popen([sys.executable, "-m", "bench.grpc_floor", "--serve", str(port_file)])
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists():
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the bare gRPC server did not start")
                time.sleep(0.02)
            with grpc.insecure_channel(f"127.0.0.1:{port_file.read_text()}", options=SYNC_CHANNEL_OPTIONS) as channel:
                yield server, channel
        finally:
            server.terminate()
            server.wait(10)


class KeptStream:
    """A bidirectional echo stream to :func:`bare_server` that stays open, fed from a queue as a
    blocking client feeds its kept RunJobs stream (``corral.run_streams``)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._call = channel.stream_stream(f"/{_SERVICE}/Echo", _ident, _ident)(iter(self._outbox.get, None))

    def round_trip_ms(self) -> float:
        """One message there and back."""
        t0 = time.perf_counter()
        self._outbox.put(_PAYLOAD)
        next(self._call)
        return (time.perf_counter() - t0) * 1000

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()


def measure(calls: int = 300) -> Floor:
    """The floor of ``calls`` round trips of each shape against a bare server, alternated."""
    with bare_server() as (server, channel):
        unary = channel.unary_unary(f"/{_SERVICE}/Unary", _ident, _ident)
        stream = channel.unary_stream(f"/{_SERVICE}/Stream", _ident, _ident)
        kept = KeptStream(channel)
        two_calls, one_call, on_kept = [], [], []
        cpu0 = 0.0
        for i in range(calls + 20):  # the first 20 warm up
            if i == 20:
                cpu0 = cpu_seconds_of(server.pid)
            t0 = time.perf_counter()
            unary(_PAYLOAD, timeout=10)
            for _ in stream(_PAYLOAD, timeout=10):
                pass
            t1 = time.perf_counter()
            for _ in stream(_PAYLOAD, timeout=10):
                pass
            if i >= 20:
                two_calls.append((t1 - t0) * 1000)
                one_call.append((time.perf_counter() - t1) * 1000)
        cpu = cpu_seconds_of(server.pid) - cpu0
        for i in range(calls + 20):  # after the others: the server's CPU above is theirs alone
            took = kept.round_trip_ms()
            if i >= 20:
                on_kept.append(took)
        kept.close()
    return Floor(
        statistics.median(two_calls),
        statistics.median(one_call),
        statistics.median(on_kept),
        cpu / (3 * calls) * 1e6,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--calls", type=int, default=300)
    a = p.parse_args(argv)
    if a.serve is not None:
        from corral import event_loop

        event_loop.run(_serve(a.serve), "uvloop")
        return
    floor = measure(a.calls)
    print(
        f"bare gRPC unary + stream round trip: {floor.two_calls_ms:.2f} ms, one stream: {floor.one_call_ms:.2f} ms, "
        f"a message on a kept stream: {floor.kept_stream_ms:.2f} ms (medians of {a.calls}); "
        f"the server's CPU: {floor.server_cpu_us_per_call:.0f} µs per call"
    )


if __name__ == "__main__":
    main()
