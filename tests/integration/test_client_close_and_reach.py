"""corral.Client and corral.AsyncClient on 127.0.0.1: what ends a call in flight when the client is closed,
and what a deadline that passes before any control plane was reached is.

- ``close()`` ends the follows in flight (in another thread, another task) with ``ClientClosed`` at once,
  and opens no new channel for them; a call made after it still works (the client stays usable).
- A deadline that passes before any answer (a port that refuses, one that accepts and never speaks
  HTTP/2) is ``Unavailable`` naming the address, not ``DeadlineExceeded``; after contact it stays
  ``DeadlineExceeded``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import corral
from corral import aio as corral_aio
from corral import client as corral_client
from corral import errors
from tests.conftest import ControlProc, wait_until
from tests.support.ports import dead_address
from tests.support.waiting import in_thread, until


def _held_job(address: str) -> str:
    """A job that stays SCHEDULED for an hour (no worker needed): something to follow that never ends."""
    with corral.Client(address, timeout=10) as client:
        return client.submit("noop", {}, scheduled_at=time.time() + 3600, labels={"t": uuid.uuid4().hex}).id


# -- close() and calls in flight -----------------------------------------------------------------------


def test_close_ends_a_watch_in_another_thread_with_client_closed(control_plane: ControlProc) -> None:
    # Given a watch in flight in another thread, that has seen the job (its stream is open)
    job_id = _held_job(control_plane.address)
    client = corral.Client(control_plane.address, timeout=10)
    seen: list[corral.Job] = []
    thread, out = in_thread(lambda: seen.extend(client.watch(job_id)))
    wait_until(lambda: seen, what="the watch's first event")
    # When the client is closed
    closed_at = time.monotonic()
    client.close()
    # Then the watch ends at once with ClientClosed (before: it watched again on a new channel, for ever)
    thread.join(5)
    assert not thread.is_alive(), "the watch went on after close()"
    assert isinstance(out.get("error"), errors.ClientClosed), out
    assert "closed" in str(out["error"]) and time.monotonic() - closed_at < 5
    # And the client stays usable: a call made after close() opens new channels
    assert client.get(job_id).id == job_id
    client.cancel(job_id)
    client.close()


def test_close_ends_a_wait_in_another_thread_with_client_closed(control_plane: ControlProc) -> None:
    # Given a wait in flight in another thread: its stream has connected the client's channel
    job_id = _held_job(control_plane.address)
    client = corral.Client(control_plane.address, timeout=10)
    thread, out = in_thread(lambda: client.wait(job_id))
    wait_until(lambda: _ready(client), what="the wait's stream to connect")
    # When the client is closed, Then the wait ends with ClientClosed within a few seconds
    client.close()
    thread.join(5)
    assert not thread.is_alive(), "the wait went on after close()"
    assert isinstance(out.get("error"), errors.ClientClosed), out
    corral.Client(control_plane.address, timeout=10).cancel(job_id)


def _ready(client: corral.Client | corral.AsyncClient) -> bool:
    """Whether the client's channel has connected (a call on it started): READY."""
    conns = client._failover.connections()
    if isinstance(client, corral.Client):
        return bool(conns) and corral_client._connected(conns[0].channel)
    return bool(conns) and corral_aio._connected(conns[0].channel)


def test_close_ends_an_async_watch_with_client_closed_not_a_bare_cancel(control_plane: ControlProc) -> None:
    job_id = _held_job(control_plane.address)

    async def scenario() -> BaseException | None:
        # Given a watch in flight in another task, that has seen the job
        client = corral.AsyncClient(control_plane.address, timeout=10)
        seen: list[corral.Job] = []

        async def watch() -> None:
            async for job in client.watch(job_id):
                seen.append(job)

        task = asyncio.create_task(watch())
        await until(lambda: seen or task.done(), what="the watch's first event")
        # When the client is closed
        await client.close()
        # Then the task ends with ClientClosed (before: a bare asyncio.CancelledError in a task that
        # nobody cancelled, or a watch that went on)
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
            return None
        error = task.exception() if not task.cancelled() else asyncio.CancelledError()
        # And the client stays usable
        assert (await client.get(job_id)).id == job_id
        await client.cancel(job_id)
        await client.close()
        return error

    error = asyncio.run(scenario())
    assert isinstance(error, errors.ClientClosed), repr(error)


def test_close_ends_an_async_wait_with_client_closed(control_plane: ControlProc) -> None:
    job_id = _held_job(control_plane.address)

    async def scenario() -> Any:
        client = corral.AsyncClient(control_plane.address, timeout=10)
        task = asyncio.create_task(client.wait(job_id))
        await until(lambda: _ready(client), what="the wait's stream to connect")
        await client.close()
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
            return "still waiting"
        return task.exception() if not task.cancelled() else asyncio.CancelledError()

    error = asyncio.run(scenario())
    corral.Client(control_plane.address, timeout=10).cancel(job_id)
    assert isinstance(error, errors.ClientClosed), repr(error)


# -- a deadline before any contact is Unavailable --------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_wait_on_an_address_that_refuses_is_unavailable_naming_it(kind: str) -> None:
    address = dead_address()

    def wait() -> Any:
        if kind == "sync":
            with corral.Client(address) as client:
                return client.wait("some-job", timeout=2)

        async def run() -> Any:
            async with corral.AsyncClient(address) as client:
                return await client.wait("some-job", timeout=2)

        return asyncio.run(run())

    # Before: DeadlineExceeded("job 'some-job' not finished after 2 s"), as if the job had been seen
    with pytest.raises(errors.Unavailable) as caught:
        wait()
    assert address in caught.value.message and "refused" in caught.value.message.lower()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_deadline_on_an_address_that_never_answers_is_unavailable_naming_it(kind: str, silent_address: str) -> None:
    def calls() -> Iterator[Any]:
        if kind == "sync":
            with corral.Client(silent_address, timeout=1) as client:
                yield lambda: client.stats()
                yield lambda: client.wait_all(["some-job"], timeout=1)
            return

        async def stats() -> Any:
            async with corral.AsyncClient(silent_address, timeout=1) as client:
                return await client.stats()

        async def wait_all() -> Any:
            async with corral.AsyncClient(silent_address, timeout=1) as client:
                return await client.wait_all(["some-job"], timeout=1)

        yield lambda: asyncio.run(stats())
        yield lambda: asyncio.run(wait_all())

    for call in calls():
        # Before: DeadlineExceeded("Deadline Exceeded"), naming no address
        with pytest.raises(errors.Unavailable) as caught:
            call()
        assert silent_address in caught.value.message


def test_a_deadline_after_contact_stays_deadline_exceeded(control_plane: ControlProc) -> None:
    job_id = _held_job(control_plane.address)
    with corral.Client(control_plane.address, timeout=10) as client:
        with pytest.raises(errors.DeadlineExceeded, match="not finished"):
            client.wait(job_id, timeout=1)
        # a WatchJobs stream of ends only is silent until a job ends: taken, yet no event came
        with pytest.raises(errors.DeadlineExceeded, match="not finished"):
            client.wait_all([job_id], timeout=1)
        client.cancel(job_id)

    async def aio() -> None:
        job = _held_job(control_plane.address)
        async with corral.AsyncClient(control_plane.address, timeout=10) as client:
            with pytest.raises(errors.DeadlineExceeded, match="not finished"):
                await client.wait_all([job], timeout=1)
            await client.cancel(job)

    asyncio.run(aio())
