"""A client given a list of control-plane addresses (``corral.Client``, ``corral.AsyncClient``, the CLI)
finds the active control plane: past a standby, past an address nobody listens on, and across a kill -9
of the active one while the standby takes over. Real control planes on one PostgreSQL database (the
session's throw-away cluster), real workers, and a submission that is never sent twice.
"""

from __future__ import annotations

import asyncio
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

import corral
from corral import JobState
from corral.errors import Unavailable
from corral.failover import moves_on
from tests.conftest import ROOT, ControlProc, base_env, wait_until
from tests.support.cli import corral as run_corral
from tests.support.ports import dead_address
from tests.support.waiting import in_thread

T = TypeVar("T")


@pytest.fixture
def planes(shared_pair: tuple[ControlProc, ControlProc, str]) -> tuple[ControlProc, ControlProc]:
    """An active control plane and a standby on one new database, on fixed ports (so that a client can
    list both before the standby leads)."""
    active, standby, _ = shared_pair
    standby.start_standby()
    return active, standby


class Api:
    """The calls a test makes, on a :class:`corral.Client` or on one :class:`corral.AsyncClient` whose
    event loop runs in a thread of its own (one client across the whole test, as a program keeps it)."""

    def __init__(self, flavour: str, address: str) -> None:
        self._sync: corral.Client | None = None
        self._async: corral.AsyncClient | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        if flavour == "sync":
            self._sync = corral.Client(address, timeout=10)
        else:
            self._async = corral.AsyncClient(address, timeout=10)
            self._thread.start()

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def submit(self, type_: str, payload: dict[str, Any] | None = None) -> corral.Job:
        if self._sync is not None:
            return self._sync.submit(type_, payload)
        assert self._async is not None
        return self._run(self._async.submit(type_, payload))

    def wait(self, job_id: str, timeout: float = 60) -> corral.Job:
        if self._sync is not None:
            return self._sync.wait(job_id, timeout)
        assert self._async is not None
        return self._run(self._async.wait(job_id, timeout))

    def get(self, job_id: str) -> corral.Job:
        if self._sync is not None:
            return self._sync.get(job_id)
        assert self._async is not None
        return self._run(self._async.get(job_id))

    @property
    def current_address(self) -> str:
        client = self._sync or self._async
        assert client is not None
        return client.current_address

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
        if self._async is not None:
            self._run(self._async.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()


@pytest.fixture(params=["sync", "async"])
def make_api(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Api]]:
    made: list[Api] = []

    def make(address: str) -> Api:
        made.append(Api(request.param, address))
        return made[-1]

    yield make
    for api in made:
        api.close()


def test_a_client_listing_the_standby_first_goes_past_it_to_the_active_one(
    planes: tuple[ControlProc, ControlProc], spawn_worker: Any, make_api: Callable[[str], Api]
) -> None:
    # Given an active control plane with a worker, and a client that lists its standby first
    active, standby = planes
    spawn_worker(active, threads=2, address=f"{active.address},{standby.address}")
    api = make_api(f"{standby.address},{active.address}")
    # When it submits and waits
    job = api.submit("add_numbers", {"a": 1, "b": 2})
    done = api.wait(job.id)
    # Then the active one ran the job, and it is where the client now goes first
    assert done.state is JobState.SUCCEEDED and done.result == {"sum": 3}
    assert api.current_address == active.address
    again = api.submit("noop")
    assert api.wait(again.id).state is JobState.SUCCEEDED
    # and the standby took nothing: both jobs are the active one's, once each
    assert [active.get(j.id).id for j in (job, again)] == [job.id, again.id]


def test_a_client_rides_through_kill_9_of_the_active_control_plane(
    planes: tuple[ControlProc, ControlProc], spawn_worker: Any, make_api: Callable[[str], Api]
) -> None:
    # Given a client and workers that list the active control plane, then its standby
    active, standby = planes
    spawn_worker(active, threads=2, address=f"{active.address},{standby.address}")
    api = make_api(f"{active.address},{standby.address}")
    first = api.submit("noop")
    assert api.wait(first.id).state is JobState.SUCCEEDED
    # and a job running on a worker, waited on
    running = api.submit("sleep", {"seconds": 2})
    wait_until(lambda: api.get(running.id).state is JobState.RUNNING, 20, what="the job to run")
    waiter, waited = in_thread(lambda: api.wait(running.id, 90))
    # When the active one is killed with SIGKILL and the standby takes over
    active.kill()
    standby.wait_serving(30)
    # Then the same client, with the same list, reaches the new active one on its own (its channel there
    # may first wait out a reconnect backoff from the takeover, at most 1 s: corral.failover)
    wait_until(lambda: _reaches(api, first.id), 5, what="the client to reach the new active control plane")
    # and submits and waits there
    after = api.submit("add_numbers", {"a": 2, "b": 3})
    assert api.wait(after.id).result == {"sum": 5}
    assert api.current_address == standby.address
    # and the wait that was under way across the kill ends with the job's success
    waiter.join(60)
    assert "error" not in waited, waited
    assert waited["value"].state is JobState.SUCCEEDED and waited["value"].id == running.id


def _reaches(api: Api, job_id: str) -> bool:
    try:
        api.get(job_id)
    except Unavailable:
        return False
    return True


def test_a_dead_address_first_is_passed_over(
    control_plane: ControlProc, spawn_worker: Any, make_api: Callable[[str], Api]
) -> None:
    spawn_worker(control_plane, threads=2)
    api = make_api(f"{dead_address()},{control_plane.address}")
    job = api.submit("add_numbers", {"a": 20, "b": 22})
    assert api.wait(job.id).result == {"sum": 42}
    assert api.current_address == control_plane.address


def test_the_cli_submits_and_waits_past_a_dead_address(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=2)
    done = run_corral("submit", "noop", "--control", f"{dead_address()},{control_plane.address}", "--wait", "--json")
    assert done.returncode == 0, done.stderr
    assert '"SUCCEEDED"' in done.stdout


_HOLDING_SERVER = """
import sys, threading, grpc
from concurrent import futures
def hold(request, context):
    print("received", flush=True)
    threading.Event().wait()
class Handler(grpc.GenericRpcHandler):
    def service(self, details):
        return grpc.unary_unary_rpc_method_handler(hold)
server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[Handler()])
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
server.wait_for_termination()
"""


def test_a_submission_cut_by_a_kill_9_after_it_reached_the_server_is_not_sent_elsewhere() -> None:
    # Given a server process that received the submission and holds it, and a second address listening
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDING_SERVER], cwd=ROOT, env=base_env(), stdout=subprocess.PIPE, text=True
    )
    second = socket.create_server(("127.0.0.1", 0))
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        listed = f"127.0.0.1:{port},127.0.0.1:{second.getsockname()[1]}"
        with corral.Client(listed, timeout=30) as client:
            submitting, submitted = in_thread(lambda: client.submit("noop"))
            readable, _, _ = select.select([holder.stdout], [], [], 20)
            assert readable and holder.stdout.readline().strip() == "received", submitted
            # When that server is killed with SIGKILL under the call
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
            submitting.join(30)
        # Then the call fails UNAVAILABLE, and nothing connected to the second address
        error = submitted.get("error")
        assert isinstance(error, Unavailable), submitted
        assert not moves_on(error), error.message
        second.setblocking(False)
        with pytest.raises(BlockingIOError):
            second.accept()
    finally:
        second.close()
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
