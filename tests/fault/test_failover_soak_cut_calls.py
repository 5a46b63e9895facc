"""A call cut by the active control plane's stop is ``Unavailable``, as README promises for a call that may
have reached a control plane, never a bare ``CorralError`` with gRPC's ``CANCELLED``.

Found by the failover soak (SIGTERM and lost database sessions of the leader on PostgreSQL while clients
submit): submissions in flight when the leader stopped surfaced as ``CorralError('CANCELLED')``, which a
caller cannot tell from anything else, where ``Unavailable`` says "the control plane went away; submit
again with the idempotency key". gRPC cancels the calls that the server had received but not yet taken
up when it stops (corral.failover.cut_by_stop).

Deterministic: the leader is stopped (SIGSTOP) while the client sends its submissions, which wait in the
leader's socket (its receive queue is watched until they are all there); then it gets SIGTERM and
SIGCONT, so that it stops with every one of them received and none taken up. Real control planes on
the session's PostgreSQL cluster.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.errors import CorralError, Unavailable
from corral.failover import moves_on
from tests.conftest import ControlProc, wait_until
from tests.support.processes import stopped
from tests.support.waiting import in_thread

CALLS = 16
REQUEST_BYTES = 40
"""Fewer bytes than one keyed SubmitJob takes on the wire (its HTTP/2 frames), for the wait below."""


def received_bytes(port: int) -> int:
    """Bytes waiting in the receive queues of the established connections to ``port`` (IPv4 and IPv6)."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, _, state, queues = line.split()[1:5]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "01":
                total += int(queues.split(":")[1], 16)
    return total


def _submit_all(flavour: str, addresses: str, keys: list[str], sent: Callable[[], None]) -> list[Any]:
    """Each keyed submission at once on one client: the job, or the error it raised."""

    def sync() -> list[Any]:
        with corral.Client(addresses, timeout=60) as client:
            client.stats()  # connected before the leader is stopped
            sent()
            calls = [in_thread(functools.partial(client.submit, "noop", idempotency_key=key)) for key in keys]
            for thread, _ in calls:
                thread.join(60)
            return [out.get("value", out.get("error")) for _, out in calls]

    async def aio() -> list[Any]:
        async with corral.AsyncClient(addresses, timeout=60) as client:
            await client.stats()
            sent()
            answers = await asyncio.gather(
                *(client.submit("noop", idempotency_key=key) for key in keys), return_exceptions=True
            )
            return list(answers)

    return sync() if flavour == "sync" else asyncio.run(aio())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_submissions_cut_by_the_leaders_stop_are_unavailable_and_their_keys_make_one_job_each(
    shared_pair: tuple[ControlProc, ControlProc, str], flavour: str
) -> None:
    # Given a leader and its standby on one database, and a client listing both
    active, standby, _ = shared_pair
    standby.start_standby()
    assert active.proc is not None
    leader = active.proc
    addresses = f"{active.address},{standby.address}"
    keys = [f"cut-{n}" for n in range(CALLS)]

    # When keyed submissions reach the leader while it is frozen, and it is stopped before it takes them up
    def freeze() -> None:
        # Stopped before the first submission is sent: a leader still running on the other core for the
        # moment the signal takes read some of them off its socket, and the wait below never ended.
        leader.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(leader.pid), 10, what="the leader to stop")

    thread, out = in_thread(lambda: _submit_all(flavour, addresses, keys, freeze))
    wait_until(lambda: received_bytes(active.port) >= CALLS * REQUEST_BYTES, 20, what="the submissions to arrive")
    leader.send_signal(signal.SIGTERM)
    leader.send_signal(signal.SIGCONT)
    thread.join(90)
    assert not thread.is_alive() and "error" not in out, out
    answers: list[Any] = out["value"]
    # Then each submission was taken, or failed Unavailable, not sent to the standby; none is a bare CANCELLED
    odd = [a for a in answers if isinstance(a, CorralError) and not isinstance(a, Unavailable)]
    assert odd == [], [(type(a).__name__, a.code, a.message) for a in odd]
    assert all(not moves_on(a) for a in answers if isinstance(a, Unavailable))
    assert all(isinstance(a, corral.Job | Unavailable) for a in answers), answers
    # and once the standby leads, submitting each again with its key gives one job per key
    # (its own SIGTERM above stops it: a second one, as active.stop() would send while its graceful stop
    # still runs on a loaded machine, cuts that stop short, and it exits by the signal)
    assert leader.wait(timeout=30) == 0
    active.proc = None
    standby.wait_serving(30)
    with corral.Client(addresses, timeout=30) as client:
        again = [client.submit("noop", idempotency_key=key) for key in keys]
        assert len({j.id for j in again}) == CALLS
        for first, second in zip(answers, again, strict=True):
            if isinstance(first, corral.Job):
                assert first.id == second.id
        assert client.list(limit=100).total == CALLS
