"""corral.AsyncClient and event loops, against a real control plane and worker on 127.0.0.1.

A client's connections (grpc.aio channels) belong to the event loop they were opened on. A client made
outside any loop, or used under one ``asyncio.run`` and then under another, opens new connections on the
new loop once the old one is closed; while the old loop is still open, a call from another loop is
refused with a clear error naming the rule. A ``watch_many`` iterator dropped half-read cancels its
stream, without a "coroutine ... was never awaited" warning.

Before, the second ``asyncio.run`` failed with a bare ``RuntimeError: Event loop is closed`` (grpc.aio
made its call's task on the first loop), with ``RuntimeWarning: coroutine 'UnaryUnaryCall._invoke' was
never awaited`` (``'UnaryStreamCall._send_unary_request'`` for a watch); a call from a second loop while
the first was open hung or failed inside grpc.aio.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

import corral
from corral import errors
from tests.conftest import ControlProc, wait_until
from tests.integration.test_rate_limits import metric


@pytest.fixture
def served(control_plane: ControlProc, spawn_worker: Any) -> ControlProc:
    spawn_worker(control_plane, threads=2, imports=())  # the built-in job types only
    return control_plane


class Noise(logging.Handler):
    """The warnings, unraisable exceptions (``Exception ignored in ...``: a warning turned error inside a
    finalizer) and asyncio's error log lines (``Exception in callback ...``, ``Task was destroyed but it is
    pending!``) while it is in use, every one recorded."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.warnings: list[warnings.WarningMessage] = []
        self.unraisable: list[str] = []
        self.logged: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.logged.append(record.getMessage())

    def lines(self) -> list[str]:
        said = [f"{w.category.__name__}: {w.message}" for w in self.warnings]
        return said + self.unraisable + self.logged


@pytest.fixture
def noise(monkeypatch: pytest.MonkeyPatch) -> Iterator[Noise]:
    found = Noise()

    def hook(unraisable: Any) -> None:
        found.unraisable.append(f"{unraisable.exc_type.__name__}: {unraisable.exc_value} in {unraisable.object!r}")

    monkeypatch.setattr(sys, "unraisablehook", hook)
    log = logging.getLogger("asyncio")
    log.addHandler(found)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
            gc.collect()  # what was dropped is finalized here, inside the block
    finally:
        log.removeHandler(found)
    found.warnings.extend(w for w in caught if not issubclass(w.category, (DeprecationWarning, ResourceWarning)))


def _later() -> datetime:
    return datetime.now().astimezone() + timedelta(hours=1)


def test_a_client_made_outside_any_loop_serves_two_asyncio_runs(served: ControlProc, noise: Noise) -> None:
    client = corral.AsyncClient(served.address, timeout=10)

    async def round_trip() -> dict[str, Any] | None:
        job = await client.submit("add_numbers", {"a": 1, "b": 2})
        done = await client.wait(job.id, timeout=30)
        watched = [update.state async for update in client.watch(job.id)]
        assert watched[-1] is corral.JobState.SUCCEEDED
        ran = await client.run("add_numbers", {"a": 2, "b": 3})  # a kept RunJobs stream
        assert ran.result == {"sum": 5}
        ends = [job async for job in client.watch_many([job.id, ran.id], ends_only=True)]
        assert {end.id for end in ends} == {job.id, ran.id}
        return done.result

    # When it is used under one asyncio.run, then under others (each closes its loop at the end)
    for _ in range(3):
        assert asyncio.run(round_trip()) == {"sum": 3}
        gc.collect()  # what the closed loop held goes now, in no loop, or in the next one
    # and closed under another
    asyncio.run(client.close())
    # Then every call was served, with nothing said about an earlier loop's leftovers (a kept RunJobs
    # stream's call, never ended, had gRPC raise "Event loop is closed" in the next loop's callbacks)
    assert noise.lines() == []


def test_a_client_made_and_used_in_one_run_serves_the_next(served: ControlProc, noise: Noise) -> None:
    async def make() -> tuple[corral.AsyncClient, str]:
        client = corral.AsyncClient(served.address, timeout=10)
        job = await client.submit("noop", scheduled_at=_later())
        return client, job.id

    client, job_id = asyncio.run(make())

    async def use() -> corral.Job:
        async with client:  # closes at the end; a later call opens new connections
            assert (await client.get(job_id)).state is corral.JobState.SCHEDULED
            return await client.cancel(job_id)

    assert asyncio.run(use()).state is corral.JobState.CANCELLED
    assert asyncio.run(client.stats()).jobs_by_status["CANCELLED"] == 1
    asyncio.run(client.close())
    assert noise.lines() == []


def test_a_call_from_a_second_loop_while_the_first_is_open_is_refused_naming_the_rule(
    served: ControlProc, noise: Noise
) -> None:
    client = corral.AsyncClient(served.address, timeout=10)
    first = asyncio.new_event_loop()
    try:
        assert first.run_until_complete(client.stats()).workers == 1
        # When another loop calls while the first is still open
        with pytest.raises(errors.FailedPrecondition) as refused:
            asyncio.run(client.stats())
        # Then it is a corral error (a RuntimeError too, as asyncio's own are) that says what to do
        assert isinstance(refused.value, RuntimeError)
        message = str(refused.value)
        assert "another event loop" in message and "still open" in message and "one AsyncClient per" in message
        # and the first loop still has the client
        assert first.run_until_complete(client.stats()).workers == 1
        first.run_until_complete(client.close())
    finally:
        first.close()
    # Once the first loop is closed, another may use it
    assert asyncio.run(client.stats()).workers == 1
    asyncio.run(client.close())
    assert noise.lines() == []


def _watched(cp: ControlProc) -> float:
    return metric(cp, "corral_watched_jobs")


@pytest.mark.parametrize("where", ["its own run", "a later run of the client"])
def test_a_half_read_watch_many_dropped_cancels_its_stream_without_a_warning(
    control_plane: ControlProc, noise: Noise, where: str
) -> None:
    client = corral.AsyncClient(control_plane.address, timeout=10)

    async def submit() -> list[str]:
        return [(await client.submit("noop", scheduled_at=_later())).id for _ in range(3)]

    async def half_read(ids: list[str]) -> None:
        updates = client.watch_many(ids)
        first = await anext(updates)  # one of three read; the stream stays open for the rest
        assert first.id in ids
        await asyncio.to_thread(wait_until, lambda: _watched(control_plane) == 3, 30, 0.05, "the stream open")
        del updates  # dropped, half-read
        gc.collect()
        # Then the control plane sees its stream end
        await asyncio.to_thread(wait_until, lambda: _watched(control_plane) == 0, 30, 0.05, "the stream cancelled")

    if where == "its own run":

        async def both() -> None:
            await half_read(await submit())

        asyncio.run(both())
    else:
        ids = asyncio.run(submit())
        asyncio.run(half_read(ids))
    asyncio.run(client.close())
    assert noise.lines() == []


def test_a_half_read_watch_many_dropped_while_its_loop_idles_cancels_its_stream_at_once(
    control_plane: ControlProc, noise: Noise
) -> None:
    # As a blocking wrapper over the AsyncClient runs it: one loop, run for each call, idle between them
    with asyncio.Runner() as runner:
        client = corral.AsyncClient(control_plane.address, timeout=10)
        ids = [runner.run(client.submit("noop", scheduled_at=_later())).id for _ in range(2)]
        updates = client.watch_many(ids)
        assert runner.run(anext(updates)).id in ids
        wait_until(lambda: _watched(control_plane) == 2, 30, 0.05, "the stream open")
        # When it is dropped half-read, with no loop running
        del updates
        gc.collect()
        # Then its stream ends now, not when the loop next runs (or never, if it is closed unrun)
        wait_until(lambda: _watched(control_plane) == 0, 30, 0.05, "the stream cancelled")
        runner.run(client.close())
    assert noise.lines() == []
