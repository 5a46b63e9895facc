"""Owners' shares on a real control plane and a real worker: fair share, per-owner caps, usage.

Each client has a token of its own (its jobs' owner). The jobs are ``sleep`` jobs, so that when a
job started (the lease, on the control plane's clock) says which owner a freed slot went to.
"""

from __future__ import annotations

import itertools
import json
import secrets
import signal
from collections.abc import Iterator
from typing import Any

import pytest

import corral
from corral import JobSpec
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest
from tests.support import cli

RUNNING = jobs_pb2.Job.RUNNING


def _clients(
    make_control_plane: Any,
    spawn_worker: Any,
    threads: int,
    worker_env: dict[str, str] | None = None,
    tokens: dict[str, str] | None = None,
    **env: str,
) -> Iterator[Any]:
    tokens = tokens if tokens is not None else {name: secrets.token_urlsafe(24) for name in ("alice", "bob", "worker")}
    cp: ControlProc = make_control_plane(
        CORRAL_AUTH_TOKENS=f"alice:{tokens['alice']},bob:{tokens['bob']}", CORRAL_WORKER_TOKEN=tokens["worker"], **env
    )
    cp.token = tokens["alice"]  # the fixtures' own calls (is the worker registered?) need a client token
    spawn_worker(cp, threads=threads, env={"CORRAL_WORKER_TOKEN": tokens["worker"], **(worker_env or {})})
    with (
        corral.Client(cp.address, token=tokens["alice"]) as alice,
        corral.Client(cp.address, token=tokens["bob"]) as bob,
    ):
        yield cp, alice, bob


@pytest.fixture
def fair(make_control_plane: Any, spawn_worker: Any) -> Iterator[Any]:
    yield from _clients(make_control_plane, spawn_worker, 2, CORRAL_FAIR_SHARE="on")


@pytest.fixture
def fair_gpus(make_control_plane: Any, spawn_worker: Any) -> Iterator[Any]:
    yield from _clients(make_control_plane, spawn_worker, 4, {"CORRAL_WORKER_GPUS": "0,1"}, CORRAL_FAIR_SHARE="on")


@pytest.fixture
def capped(make_control_plane: Any, spawn_worker: Any) -> Iterator[Any]:
    yield from _clients(make_control_plane, spawn_worker, 4, CORRAL_OWNER_MAX_RUNNING="1")


def _sleeps(client: corral.Client, n: int, seconds: float) -> list[str]:
    return [j.id for j in client.submit_many([JobSpec("sleep", {"seconds": seconds}) for _ in range(n)])]


def _done(client: corral.Client, ids: list[str]) -> list[corral.Job]:
    jobs = [client.wait(i, timeout=60) for i in ids]
    assert {j.state.name for j in jobs} == {"SUCCEEDED"}
    return jobs


def test_fair_share_lets_a_late_client_in_ahead_of_another_s_backlog(fair: Any) -> None:
    _, alice, bob = fair
    # Given alice's backlog of 12 jobs on a worker with 2 slots
    alice_ids = _sleeps(alice, 12, 0.2)
    # When bob submits 2 jobs after it
    bob_ids = _sleeps(bob, 2, 0.2)
    alice_jobs, bob_jobs = _done(alice, alice_ids), _done(bob, bob_ids)
    # Then bob's jobs start as the first slots free, not after all of alice's: most of her jobs start
    # after his last one (in submission order none would)
    last_bob = max(j.started_at for j in bob_jobs if j.started_at)
    after = [j for j in alice_jobs if j.started_at and j.started_at > last_bob]
    assert len(after) >= 6, f"only {len(after)} of alice's 12 jobs started after bob's"


def test_fair_share_counts_the_gpus_an_owner_holds_not_only_its_threads(fair_gpus: Any) -> None:
    cp, alice, bob = fair_gpus
    # Given a worker of 4 threads and 2 GPUs, full: alice's one-thread job holds both GPUs, bob runs three
    # one-thread jobs, one of which is about to be cancelled
    hog = alice.submit("sleep", {"seconds": 120}, gpu_count=2).id
    bobs = _sleeps(bob, 3, 120)
    wait_until(lambda: all(cp.get(i).state == RUNNING for i in [hog, *bobs]), what="a full worker")
    # (as /metrics shows: alice holds all of the GPUs, bob three quarters of the threads)
    metrics = scrape(Rest(cp.http_port))
    shares = {k: v for k, v in metrics.items() if k.startswith("corral_share_dominant")}
    assert shares == {'corral_share_dominant{share="alice"}': 1.0, 'corral_share_dominant{share="bob"}': 0.75}
    # When each queues a plain job, and then a thread frees
    alice_next = alice.submit("sleep", {"seconds": 0.2}).id
    bob_next = bob.submit("sleep", {"seconds": 0.2}).id
    bob.cancel(bobs[0])
    # Then bob's goes first, since he holds half the threads and alice all the GPUs (by threads alone,
    # her one would be less than his two), and hers gets the thread after it
    first, second = bob.wait(bob_next, timeout=60), alice.wait(alice_next, timeout=60)
    assert first.started_at and second.started_at and first.finished_at
    assert first.started_at < second.started_at
    assert second.started_at >= first.finished_at
    for job_id, client in [(hog, alice), (bobs[1], bob), (bobs[2], bob)]:
        client.cancel(job_id)


def test_an_owner_cap_holds_its_jobs_while_others_run(capped: Any) -> None:
    cp, alice, bob = capped
    # Given a cap of one running job per owner and a worker with 4 slots
    alice_ids = _sleeps(alice, 3, 0.3)
    bob_ids = _sleeps(bob, 1, 0.3)
    alice_jobs, (bob_job,) = _done(alice, alice_ids), _done(bob, bob_ids)
    # Then alice's jobs ran one at a time although slots were free
    runs = sorted((j.started_at, j.finished_at) for j in alice_jobs if j.started_at and j.finished_at)
    assert len(runs) == 3
    for (_, end), (start, _) in itertools.pairwise(runs):
        assert start >= end, runs
    # while bob's ran beside her first one
    assert bob_job.started_at is not None and bob_job.started_at < runs[0][1]
    # and each owner's thread-time is counted
    metrics = scrape(Rest(cp.http_port))
    assert metrics['corral_owner_thread_seconds_total{group="",owner="alice"}'] >= 0.9
    assert metrics['corral_owner_thread_seconds_total{group="",owner="bob"}'] >= 0.3
    assert metrics['corral_owner_running_jobs{group="",owner="alice"}'] == 0


@pytest.fixture
def fair_with_history(make_control_plane: Any, spawn_worker: Any) -> Iterator[Any]:
    yield from _clients(
        make_control_plane, spawn_worker, 2, CORRAL_FAIR_SHARE="on", CORRAL_FAIR_SHARE_HALF_LIFE_SEC="1"
    )


def test_with_a_half_life_an_owner_that_had_the_cluster_lately_lets_a_newcomer_in_first(
    fair_with_history: Any,
) -> None:
    cp, alice, bob = fair_with_history
    # Given alice holding both slots of the worker for 3 s (three half-lives)
    hold = _sleeps(alice, 2, 3.0)
    wait_until(lambda: all(cp.get(i).state == RUNNING for i in hold), what="alice's jobs to hold the worker")
    # and, while they run, alice's next 4 jobs queued, then bob's 4
    alice_ids = _sleeps(alice, 4, 0.3)
    bob_ids = _sleeps(bob, 4, 0.3)
    # (/metrics shows what alice held lately; bob has held nothing)
    metrics = scrape(Rest(cp.http_port))
    assert 0 < metrics['corral_share_recent{share="alice"}'] <= 1
    assert metrics.get('corral_share_recent{share="bob"}', 0.0) == 0.0
    _done(alice, hold)
    alice_jobs, bob_jobs = _done(alice, alice_ids), _done(bob, bob_ids)
    # Then, when her jobs end and both slots free, both go to bob, though alice's jobs are older and
    # neither of them holds anything then (without the half-life, hers would go first)
    starts = sorted([(j.started_at, "alice") for j in alice_jobs] + [(j.started_at, "bob") for j in bob_jobs])
    assert [owner for _, owner in starts[:2]] == ["bob", "bob"], starts


@pytest.fixture
def fair_with_long_history(make_control_plane: Any, spawn_worker: Any) -> Iterator[Any]:
    yield from _clients(
        make_control_plane, spawn_worker, 2, CORRAL_FAIR_SHARE="on", CORRAL_FAIR_SHARE_HALF_LIFE_SEC="3600"
    )


def test_the_history_of_shares_and_usage_survive_a_restart(fair_with_long_history: Any) -> None:
    cp, alice, _ = fair_with_long_history
    # Given alice, who held both slots for a second
    _done(alice, _sleeps(alice, 2, 1.0))
    metrics = scrape(Rest(cp.http_port))
    before = metrics['corral_share_recent{share="alice"}']
    used = metrics['corral_owner_thread_seconds_total{group="",owner="alice"}']
    assert before > 0 and used >= 2.0
    # When the control plane is stopped and started again
    assert cp.stop(signal.SIGTERM) == 0
    cp.start()
    wait_until(lambda: len(alice.workers()) == 1, what="the worker back (a share is a part of its threads)")
    # Then what she held lately is still counted (an hour's half-life fades it by a ten-thousandth a second)
    metrics = scrape(Rest(cp.http_port))
    assert metrics['corral_share_recent{share="alice"}'] == pytest.approx(before, rel=1e-3)
    # and so is the thread-time her jobs used (usage accounting adds up across restarts), while the
    # counter behind /metrics starts again, as Prometheus expects of a restarted process
    assert alice.shares().shares[0].thread_seconds == pytest.approx(used)
    assert metrics.get('corral_owner_thread_seconds_total{group="",owner="alice"}', 0.0) == 0.0


@pytest.fixture
def fair_with_admin(make_control_plane: Any, spawn_worker: Any) -> Iterator[Any]:
    tokens = {name: secrets.token_urlsafe(24) for name in ("alice", "bob", "worker")}
    for cp, alice, bob in _clients(
        make_control_plane,
        spawn_worker,
        2,
        tokens=tokens,
        CORRAL_FAIR_SHARE="on",
        CORRAL_FAIR_SHARE_HALF_LIFE_SEC="600",
        CORRAL_OWNER_WEIGHTS="bob=2",
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="alice",
    ):
        yield cp, alice, bob, tokens


def test_list_shares_shows_holdings_queue_usage_and_rank_to_admins_over_every_surface(fair_with_admin: Any) -> None:
    cp, alice, bob, tokens = fair_with_admin
    # Given alice holding both slots, a job of hers and two of bob's queued behind, and a job of bob's
    # that ran for 0.3 s
    _done(bob, _sleeps(bob, 1, 0.3))
    holding = _sleeps(alice, 2, 60)
    wait_until(lambda: all(cp.get(i).state == RUNNING for i in holding), what="alice's jobs to hold the worker")
    queued = _sleeps(alice, 1, 0.1) + _sleeps(bob, 2, 0.1)
    # When an admin lists the shares
    got = alice.shares()
    # Then bob's is first (he holds nothing: rank = his history / 2), alice's after it (all of the threads)
    assert (got.fair_share, got.half_life_sec) == (True, 600.0)
    assert [s.name for s in got.shares] == ["bob", "alice"]
    b, a = got.shares
    assert (a.owners, a.running_jobs, a.threads, a.queued_jobs, a.dominant_share) == (["alice"], 2, 2, 1, 1.0)
    assert (b.weight, b.running_jobs, b.queued_jobs, b.dominant_share) == (2.0, 0, 2, 0.0)
    assert b.thread_seconds >= 0.3 and b.recent_share > 0 and a.recent_share > 0
    assert a.rank == pytest.approx(a.dominant_share + a.recent_share)
    assert b.rank == pytest.approx(b.recent_share / 2)
    # and the same over REST and the CLI; anyone else is refused
    rest = Rest(cp.http_port)
    reply = rest.get("/v1/shares", headers={"Authorization": f"Bearer {tokens['alice']}"})
    assert reply.status == 200, reply.body
    assert [(s["name"], s.get("queuedJobs", 0)) for s in reply.json()["shares"]] == [("bob", 2), ("alice", 1)]
    env = {"CORRAL_CONTROL_ADDR": cp.address, "CORRAL_TOKEN": tokens["alice"]}
    done = cli.corral("shares", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert [s["name"] for s in json.loads(done.stdout)["shares"]] == ["bob", "alice"]
    table = cli.corral("shares", env=env)
    assert table.returncode == 0, table.stderr
    assert "fair share on, half-life 600 s" in table.stdout and "100.0%" in table.stdout
    with pytest.raises(corral.PermissionDenied):
        bob.shares()
    assert rest.get("/v1/shares", headers={"Authorization": f"Bearer {tokens['bob']}"}).status == 403
    refused = cli.corral("shares", env={**env, "CORRAL_TOKEN": tokens["bob"]})
    assert refused.returncode != 0 and "PERMISSION_DENIED" in refused.stderr
    for job_id in holding:
        alice.cancel(job_id)
    _done(alice, queued[:1])
    _done(bob, queued[1:])


def test_shares_say_what_is_connected_and_show_no_parts_while_no_worker_is(
    make_control_plane: Any, spawn_worker: Any
) -> None:
    tokens = {name: secrets.token_urlsafe(24) for name in ("alice", "bob", "worker")}
    cp: ControlProc = make_control_plane(
        CORRAL_AUTH_TOKENS=f"alice:{tokens['alice']},bob:{tokens['bob']}",
        CORRAL_WORKER_TOKEN=tokens["worker"],
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="alice",
    )
    cp.token = tokens["alice"]
    worker = spawn_worker(cp, threads=2, env={"CORRAL_WORKER_TOKEN": tokens["worker"]})
    env = {"CORRAL_CONTROL_ADDR": cp.address, "CORRAL_TOKEN": tokens["alice"]}
    with corral.Client(cp.address, token=tokens["alice"]) as alice:
        # Given alice's jobs holding both of the worker's threads
        holding = _sleeps(alice, 2, 60)
        wait_until(lambda: all(cp.get(i).state == RUNNING for i in holding), what="alice's jobs to hold the worker")
        # Then the shares say what is connected: the whole her dominant share is a part of
        got = alice.shares()
        assert (got.connected_threads, got.connected_gpus) == (2, 0) and got.connected_memory_mb > 0
        assert [(s.name, s.threads, s.dominant_share) for s in got.shares] == [("alice", 2, 1.0)]
        table = cli.corral("shares", env=env)
        assert table.returncode == 0, table.stderr
        assert "; 2 threads, " in table.stdout and " GiB connected" in table.stdout and "100.0%" in table.stdout
        # When the control plane restarts while the worker stands still (its jobs still running on it)
        assert cp.stop(signal.SIGTERM) == 0
        worker.signal(signal.SIGSTOP)
        try:
            cp.start()
            # Then her jobs are still held, and nothing claims a part of a cluster with no worker in it
            got = alice.shares()
            assert got.connected_threads == 0
            assert [(s.name, s.running_jobs, s.threads) for s in got.shares] == [("alice", 2, 2)]
            table = cli.corral("shares", env=env)
            assert table.returncode == 0, table.stderr
            assert "no worker connected" in table.stdout and "%" not in table.stdout
            rest = Rest(cp.http_port)
            reply = rest.get("/v1/shares", headers={"Authorization": f"Bearer {tokens['alice']}"})
            assert reply.status == 200, reply.body
            assert reply.json().get("connectedThreads", 0) == 0
        finally:
            worker.signal(signal.SIGCONT)
        # and once the worker is back, the parts are parts again, over REST too
        wait_until(lambda: alice.shares().connected_threads == 2, what="the worker back")
        assert [(s.name, s.dominant_share) for s in alice.shares().shares] == [("alice", 1.0)]
        reply = Rest(cp.http_port).get("/v1/shares", headers={"Authorization": f"Bearer {tokens['alice']}"})
        assert reply.json()["connectedThreads"] == 2
        alice.cancel_many(ids=holding)
