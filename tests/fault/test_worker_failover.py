"""Worker failover: a worker given several control-plane addresses finds the one that serves.

CORRAL_CONTROL_ADDR (``--control``) may list a control plane and its standbys. A session uses one
address; an attempt that fails moves on round the list, and the backoff grows only once per round,
so a dead address costs one quick attempt and a takeover is found quickly
(:class:`worker.reconnect.AddressRotation`).

- The schedule itself, without processes: where each attempt goes and how long it waits.
- Real processes on 127.0.0.1: a dead first address (a port nothing listens on) is passed over and
  the worker registers and runs jobs on the live one; kill -9 of the control plane a worker is
  connected to moves it to the next one within a deadline, and on round the list when that one dies
  too; the same with mutual TLS (one set of credentials for every address).

Two control planes on two SQLite files stand in for an active one and its standby on a shared
database: what is checked is the worker's side, that it reaches whichever one is serving.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc, registered_on, wait_until
from tests.integration.test_auth import token
from tests.integration.test_tls import tls_env, worker_env
from tests.support.calls import result, submit, wait_done
from tests.support.certs import make_pki
from tests.support.ports import dead_address
from worker.reconnect import AddressRotation

S = jobs_pb2.Job

FAILOVER_DEADLINE_SEC = 5.0
"""How soon after kill -9 the worker must be registered on the next control plane: well under the
heartbeat timeout of a real deployment (10 s), so that the control plane taking over finds its workers
back before it would count them lost. Expected: a few tens of milliseconds (one refused attempt)."""


def worker_events(worker: WorkerProc, event: str) -> list[dict[str, Any]]:
    """The worker's JSON log lines of ``event`` so far, parsed."""
    lines = (json.loads(line) for line in worker.log.read_text().splitlines() if line.startswith("{"))
    return [line for line in lines if line.get("event") == event]


class _Top(random.Random):
    """Jitter at its top: every wait is the ceiling of its range, so the schedule reads exactly."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_the_wait_grows_once_per_round_and_a_registered_address_is_tried_first() -> None:
    # Given three addresses, the wait read at its ceiling, capped at 2 s
    rotation, rng = AddressRotation(["a:1", "b:2", "c:3"]), _Top()

    def fail() -> tuple[str, float]:
        rotation.ended(registered=False)
        return rotation.current, rotation.delay(2.0, rng)

    # When every attempt fails, Then each goes to the next address and the wait doubles once per round
    assert rotation.current == "a:1"
    assert [fail() for _ in range(7)] == [
        ("b:2", 0.05), ("c:3", 0.05), ("a:1", 0.1), ("b:2", 0.1), ("c:3", 0.1), ("a:1", 0.2), ("b:2", 0.2),
    ]  # fmt: skip
    # When a session registers on b:2 and later ends, Then b:2 is tried first, at the shortest wait
    rotation.ended(registered=True)
    assert (rotation.current, rotation.retry, rotation.delay(2.0, rng)) == ("b:2", 0, 0.05)
    # and then the others, round the list
    assert [fail()[0] for _ in range(3)] == ["c:3", "a:1", "b:2"]
    # With one address it is the single-address schedule: the wait doubles on every failure, to the cap
    single = AddressRotation(["a:1"])
    waits = []
    for _ in range(7):
        single.ended(registered=False)
        waits.append(single.delay(2.0, rng))
    assert (single.current, waits) == ("a:1", [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])


def test_a_dead_first_address_is_passed_over_and_jobs_run_on_the_live_one(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a worker whose first address has nothing listening
    dead = dead_address()
    worker = spawn_worker(control_plane, address=f"{dead}, {control_plane.address}")  # waits until registered
    # When a job is submitted, Then it runs on that worker
    done = wait_done(control_plane, submit(control_plane, "add_numbers", {"a": 40, "b": 2}).id)
    assert (done.state, result(done), done.worker_id) == (S.SUCCEEDED, {"sum": 42}, worker.worker_id)
    # and the log says where each attempt went: the dead address once, then the live one
    tried = [(e["control_addr"], e["retry"]) for e in worker_events(worker, "worker_connecting")]
    assert tried[:2] == [(dead, 0), (control_plane.address, 1)]
    assert [e["control_addr"] for e in worker_events(worker, "worker_disconnected")][:1] == [dead]
    assert [e["control_addr"] for e in worker_events(worker, "worker_registered")] == [control_plane.address]


def test_kill_9_of_the_control_plane_moves_the_worker_to_the_next_one_round_the_list(
    make_control_plane: Any, spawn_worker: Any
) -> None:
    # Given a worker that lists control planes A and B and is registered on A
    a, b = make_control_plane(), make_control_plane()
    worker = spawn_worker(a, address=f"{a.address},{b.address}")
    assert not registered_on(b, worker)
    # When A is killed with SIGKILL
    a.kill()
    # Then the worker registers on B within the deadline, and runs B's jobs
    wait_until(lambda: registered_on(b, worker), timeout=FAILOVER_DEADLINE_SEC, what="the worker to register on B")
    done = wait_done(b, submit(b, "add_numbers", {"a": 1, "b": 2}).id)
    assert (done.state, result(done), done.worker_id) == (S.SUCCEEDED, {"sum": 3}, worker.worker_id)
    # When A is back (same port) and then B is killed in turn
    a.start()
    assert not registered_on(a, worker), "a worker registered on B stays there while B serves"
    b.kill()
    # Then B is tried first (it was serving), and the worker goes on round the list, back to A
    wait_until(lambda: registered_on(a, worker), timeout=FAILOVER_DEADLINE_SEC, what="the worker to return to A")
    # (A lists the worker as soon as it registers it; the worker logs its registration when A's reply
    # arrives, a moment later)
    wait_until(lambda: len(worker_events(worker, "worker_registered")) >= 3, what="the worker to log its return to A")
    assert [e["control_addr"] for e in worker_events(worker, "worker_registered")] == [a.address, b.address, a.address]
    after_b = [e["control_addr"] for e in worker_events(worker, "worker_connecting")][-2:]
    assert after_b == [b.address, a.address]


def test_a_worker_with_mutual_tls_fails_over_with_the_same_credentials(
    make_control_plane: Any, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given two control planes that ask workers for a certificate and the same worker token
    pki, worker_token = make_pki(tmp_path / "pki"), token()
    planes: list[ControlProc] = []
    for _ in range(2):
        cp = make_control_plane(
            **tls_env(pki), CORRAL_TLS_CLIENT_CA=str(pki.ca), CORRAL_WORKER_PORT="0", CORRAL_WORKER_TOKEN=worker_token
        )
        cp.tls_ca = pki.ca
        planes.append(cp)
    a, b = planes
    # and a worker with one certificate that lists both worker ports
    env = worker_env(pki, pki.worker_cert, pki.worker_key, worker_token)
    worker = spawn_worker(a, env=env, address=f"127.0.0.1:{a.worker_port},127.0.0.1:{b.worker_port}")
    # When A is killed with SIGKILL, Then the worker registers on B over mutual TLS
    a.kill()
    wait_until(lambda: registered_on(b, worker), timeout=FAILOVER_DEADLINE_SEC, what="the worker to register on B")
    done = wait_done(b, submit(b, "add_numbers", {"a": 5, "b": 6}).id)
    assert (done.state, done.worker_id) == (S.SUCCEEDED, worker.worker_id)
    assert not [e for e in worker_events(worker, "worker_refused")]
