"""A scripted control plane for worker tests: a real grpc.aio WorkerService on 127.0.0.1:0.

Each Connect stream is handed to the test as a :class:`Session`: what the worker sent (``next``,
``results``) and a way to answer it (``registered``, ``assign``, ``ack``, ``send``, ``end``). Run it
in the test's event loop: ``control = FakeControl(); await control.start()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from corral.v1 import workers_pb2 as pb
from corral.v1 import workers_pb2_grpc as pb_grpc
from worker import Agent, WorkerConfig


class Session:
    """One Connect stream as the control plane sees it."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[pb.WorkerMessage] = asyncio.Queue()
        self.outbox: asyncio.Queue[pb.ControlMessage | None] = asyncio.Queue()
        self.results_messages = 0

    async def next(self, kind: str, within: float = 10.0) -> Any:
        """The next message of this kind (others are skipped), e.g. ``await s.next("results")``."""
        async with asyncio.timeout(within):
            while True:
                message = await self.inbox.get()
                if message.WhichOneof("msg") == kind:
                    return getattr(message, kind)

    async def results(self, count: int, within: float = 10.0) -> dict[tuple[str, int], pb.JobResult]:
        """Collect ``count`` results (over as many Results messages as it takes)."""
        out: dict[tuple[str, int], pb.JobResult] = {}
        while len(out) < count:
            message = await self.next("results", within)
            self.results_messages += 1
            for r in message.results:
                out[(r.attempt.job_id, r.attempt.attempt)] = r
        return out

    def send(self, **fields: Any) -> None:
        self.outbox.put_nowait(pb.ControlMessage(**fields))

    def registered(self, interval: float = 0.2, **fields: Any) -> None:
        self.send(registered=pb.Registered(worker_id="w-test", heartbeat_interval_sec=interval, **fields))

    def assign(self, *assignments: pb.Assignment) -> None:
        self.send(assign=pb.Assign(assignments=list(assignments)))

    def ack(self, *keys: tuple[str, int]) -> None:
        self.send(ack=pb.Ack(attempts=[pb.AttemptRef(job_id=j, attempt=a) for j, a in keys]))

    def end(self) -> None:
        self.outbox.put_nowait(None)


def job(job_id: str, type_: str, payload: dict[str, Any] | None = None, timeout: float = 30.0) -> pb.Assignment:
    return pb.Assignment(
        job_id=job_id, attempt=1, type=type_, payload_json=json.dumps(payload or {}), threads=1, timeout_sec=timeout
    )


class FakeControl(pb_grpc.WorkerServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.sessions: asyncio.Queue[Session] = asyncio.Queue()
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def Connect(self, request_iterator: AsyncIterator[pb.WorkerMessage], context: Any) -> None:  # type: ignore[override]
        session = Session()
        self.sessions.put_nowait(session)

        async def read() -> None:
            async for message in request_iterator:
                session.inbox.put_nowait(message)

        reader = asyncio.create_task(read())
        try:
            while (message := await session.outbox.get()) is not None:
                await context.write(message)
        finally:
            reader.cancel()

    async def start(self) -> None:
        self.server = grpc.aio.server()
        pb_grpc.add_WorkerServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None

    async def session(self, within: float = 10.0) -> Session:
        async with asyncio.timeout(within):
            return await self.sessions.get()


ROOT = Path(__file__).resolve().parents[2]


def worker_env() -> dict[str, str]:
    """This environment, with the repository importable (a worker process imports tests.support plug-ins)."""
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


async def spawn_worker_process(port: int, *extra: str) -> asyncio.subprocess.Process:
    """``python -m worker`` (2 threads, id ``w-main``, :mod:`tests.support.jobtypes`) connecting to
    127.0.0.1:``port``; flags in ``extra`` come last, so they override those."""
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "worker", "--control", f"127.0.0.1:{port}", "--threads", "2"),
        *("--worker-id", "w-main", "--import", "tests.support.jobtypes", "--log-format", "logfmt", *extra),
        cwd=ROOT,
        env=worker_env(),
        stderr=subprocess.DEVNULL,
    )


@contextlib.asynccontextmanager
async def worker_with_fake_control(*extra: str) -> AsyncIterator[tuple[FakeControl, asyncio.subprocess.Process]]:
    """A :class:`FakeControl` and a :func:`spawn_worker_process` connected to it; both gone afterwards."""
    control = FakeControl()
    await control.start()
    proc = await spawn_worker_process(control.port, *extra)
    try:
        yield control, proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await control.stop()


def run_agent(body: Callable[[FakeControl, Agent], Awaitable[None]], **config: Any) -> None:
    """Run ``body`` with a :class:`FakeControl` and a real in-process :class:`worker.Agent` connected to
    it (id ``w-test``, one slot, quick reconnects; ``config`` sets any other WorkerConfig field)."""

    async def main() -> None:
        control = FakeControl()
        await control.start()
        settings: dict[str, Any] = {"threads": 1, "slots": 1, "worker_id": "w-test", "reconnect_max_sec": 0.2}
        agent = Agent(WorkerConfig(control_addr=f"127.0.0.1:{control.port}", **{**settings, **config}))
        try:
            async with agent:
                await body(control, agent)
        finally:
            await control.stop()

    asyncio.run(main())
