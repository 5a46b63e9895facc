"""``AsyncClient.run`` goes past a standby listed first, as every call does (README, "Standby control
planes"), and never raises gRPC's ``INTERNAL: Internal error from Core``.

Found by the failover soak (asyncio clients running jobs across takeovers): a ``run`` opens a
``RunJobs`` stream and writes its request; a standby refuses every call at once, and when its refusal
ended the stream before the write, grpc.aio failed the write with ``INTERNAL: Internal error from
Core`` in place of the standby's ``UNAVAILABLE: standby: ...``. That was not a refusal the client
could recognise, so the run stopped at the standby and raised ``Internal`` (2 runs in 30 here), where
the request had never been sent and the active control plane was next in the list.

Each run below is a fresh client, so a fresh stream whose write races the standby's refusal; before the
fix some of the 100 failed (about one in 15), after it none may. Real control planes on the session's
PostgreSQL cluster and a real worker.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import corral
from corral import JobState
from corral.errors import CorralError
from tests.conftest import ControlProc

RUNS = 100


def test_async_runs_from_a_client_listing_the_standby_first_all_go_past_it(
    shared_pair: tuple[ControlProc, ControlProc, str], spawn_worker: Any
) -> None:
    # Given an active control plane with a worker, its standby, and clients listing the standby first
    active, standby, _ = shared_pair
    standby.start_standby()
    spawn_worker(active, threads=2, address=f"{active.address},{standby.address}")
    addresses = f"{standby.address},{active.address}"

    async def runs() -> Counter[str]:
        outcomes: Counter[str] = Counter()
        for _ in range(RUNS):
            async with corral.AsyncClient(addresses, timeout=30) as client:
                try:
                    done = await client.run("noop")
                except CorralError as exc:
                    outcomes[f"{type(exc).__name__}: {exc.message}"] += 1
                    continue
                outcomes[done.state.name] += 1
                assert client.current_address == active.address
        return outcomes

    # When each runs a job (a fresh RunJobs stream each time)
    outcomes = asyncio.run(runs())
    # Then every run went past the standby and its job succeeded on the active one
    assert outcomes == {JobState.SUCCEEDED.name: RUNS}
