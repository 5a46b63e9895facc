"""A client following a job (``wait``, ``watch``, ``wait_all``, sync and asyncio) while the control plane
restarts.

The job outlives the restart (it is durable and keeps running on its worker), so the client must too:
it watches again, sees each state once, and gives up only after the outage limit or its own timeout.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import corral
from corral import JobState, follow
from corral.client import KEEPALIVE_SEC
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.partition import PartitionableRelay
from tests.support.waiting import in_thread


@pytest.fixture
def served(control_plane: ControlProc, spawn_worker: Any) -> ControlProc:
    spawn_worker(control_plane, threads=2, imports=())
    return control_plane


def restart(cp: ControlProc, down_sec: float, kill: bool = False) -> None:
    """SIGTERM (``kill``: SIGKILL) the control plane, leave it down ``down_sec``, start it again (same
    port and store)."""
    if kill:
        cp.kill()
    else:
        assert cp.stop() == 0
    time.sleep(down_sec)  # the outage being tested: the client must ride through it
    cp.start()


def watched_jobs(cp: ControlProc) -> float:
    """``corral_watched_jobs`` of the control plane: jobs its open streams follow (0 if it cannot say)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{cp.http_port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("corral_watched_jobs "):
            return float(line.split()[1])
    return 0.0


@pytest.fixture(params=["sync", "async"])
def follower(request: pytest.FixtureRequest, served: ControlProc) -> Iterator[dict[str, Callable[..., Any]]]:
    """wait/wait_all/watch/run of a Client or an AsyncClient, as blocking calls (the async ones on a loop of
    their own)."""
    if request.param == "sync":
        client = corral.Client(served.address, timeout=10)

        def watch_sync(job_id: str, on_event: Callable[[corral.Job], None]) -> list[corral.Job]:
            seen = []
            for job in client.watch(job_id):
                on_event(job)
                seen.append(job)
            return seen

        yield {
            "wait": client.wait,
            "wait_all": client.wait_all,
            "watch": watch_sync,
            "submit": client.submit,
            "run": client.run,
        }
        client.close()
        return

    async def wait(job_id: str, limit: float | None = None) -> corral.Job:
        async with corral.AsyncClient(served.address, timeout=10) as c:
            return await c.wait(job_id, timeout=limit)

    async def wait_all(ids: list[str], limit: float | None = None) -> list[corral.Job]:
        async with corral.AsyncClient(served.address, timeout=10) as c:
            return await c.wait_all(ids, timeout=limit)

    async def watch(job_id: str, on_event: Callable[[corral.Job], None]) -> list[corral.Job]:
        seen = []
        async with corral.AsyncClient(served.address, timeout=10) as c:
            async for job in c.watch(job_id):
                on_event(job)
                seen.append(job)
        return seen

    async def run(*args: Any, **kwargs: Any) -> corral.Job:
        async with corral.AsyncClient(served.address, timeout=10) as c:
            return await c.run(*args, **kwargs)

    with corral.Client(served.address, timeout=10) as submitter:
        yield {
            "run": lambda *args, **kwargs: asyncio.run(run(*args, **kwargs)),
            "wait": lambda job_id, limit=None: asyncio.run(wait(job_id, limit)),
            "wait_all": lambda ids, limit=None: asyncio.run(wait_all(ids, limit)),
            "watch": lambda job_id, on_event: asyncio.run(watch(job_id, on_event)),
            "submit": submitter.submit,
        }


def test_wait_and_watch_ride_through_a_control_plane_restart(served: ControlProc, follower: Any) -> None:
    # Given a job that runs for a while, followed by a wait and by a watch
    job = follower["submit"]("sleep", {"seconds": 3})
    running = threading.Event()
    waiting, waited = in_thread(lambda: follower["wait"](job.id, 60))
    watching, watched = in_thread(
        lambda: follower["watch"](job.id, lambda j: running.set() if j.state is JobState.RUNNING else None)
    )
    assert running.wait(30), "the watch never saw the job run"

    # When the control plane stops and comes back 1 s later, while the job runs on its worker
    restart(served, 1.0)

    # Then both return the job's end, as if nothing happened: it ran once, and each state came once
    waiting.join(30)
    watching.join(30)
    assert "error" not in waited and "error" not in watched, (waited, watched)
    done = waited["value"]
    assert done.state is JobState.SUCCEEDED and done.attempts == 1
    states = [j.state for j in watched["value"]]
    assert states[-1] is JobState.SUCCEEDED and JobState.RUNNING in states
    assert len(states) == len(set(states)), f"a state was seen twice: {states}"


def wait_all_on_a_running_job(served: ControlProc, follower: Any) -> tuple[str, threading.Thread, dict[str, Any]]:
    """A job that runs until it is cancelled, and a wait_all on it whose stream the control plane took:
    with ends_only it sends nothing until the job ends, so the client has no event."""
    job_id: str = follower["submit"]("sleep", {"seconds": 600}).id
    wait_until(lambda: served.get(job_id).state == jobs_pb2.Job.RUNNING, 30, what="the job to run")
    waiting, waited = in_thread(lambda: follower["wait_all"]([job_id], 120))
    wait_until(lambda: watched_jobs(served) >= 1, 30, what="the control plane to take the stream")
    return job_id, waiting, waited


def cancelled_and_waited(served: ControlProc, job_id: str, waiting: threading.Thread, waited: dict[str, Any]) -> None:
    """The wait still waits (it rode through the restarts); cancelled, the job is what it returns."""
    assert waiting.is_alive(), waited
    served.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=job_id), timeout=10)
    waiting.join(30)
    assert not waiting.is_alive() and "error" not in waited, waited
    assert [(j.id, j.state) for j in waited["value"]] == [(job_id, JobState.CANCELLED)]


def test_wait_all_rides_through_a_kill_longer_than_the_first_contact_limit(
    served: ControlProc, follower: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follow, "FIRST_CONTACT_LIMIT_SEC", 1.0)  # so that the outage that outlasts it is short
    # Given a wait_all on a running job, whose stream the control plane took (and sent nothing on)
    job_id, waiting, waited = wait_all_on_a_running_job(served, follower)
    # When the control plane is killed, and comes back after longer than the first-contact limit
    restart(served, 2.0, kill=True)
    wait_until(lambda: watched_jobs(served) >= 1 or not waiting.is_alive(), 30, what="the wait to watch again")
    # Then the wait rides through it, as wait does (before: Unavailable 1 s into the outage)
    cancelled_and_waited(served, job_id, waiting, waited)


def test_wait_all_gets_the_whole_outage_limit_again_at_a_later_restart(
    served: ControlProc, follower: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the limits made short, so that restarts further apart than them take seconds)
    monkeypatch.setattr(follow, "OUTAGE_LIMIT_SEC", 6.0)
    monkeypatch.setattr(follow, "FIRST_CONTACT_LIMIT_SEC", 6.0)
    monkeypatch.setattr(follow, "SERVED_SEC", 1.0)
    # Given a wait_all on a running job that rode through a restart, with no event before or after it
    job_id, waiting, waited = wait_all_on_a_running_job(served, follower)
    first = time.monotonic()
    restart(served, 0.5)
    wait_until(lambda: watched_jobs(served) >= 1, 30, what="the control plane to take the stream again")
    back = time.monotonic()
    # When it restarts again, later than the outage limit after the first restart, once the new stream
    # has been served a while
    wait_until(
        lambda: time.monotonic() - first > follow.OUTAGE_LIMIT_SEC and time.monotonic() - back > follow.SERVED_SEC,
        30,
        what="the second restart to be due",
    )
    restart(served, 0.5)
    wait_until(lambda: watched_jobs(served) >= 1 or not waiting.is_alive(), 30, what="the wait to watch again")
    # Then the wait rides through this one too (before: Unavailable at once, the outage counted from
    # the first restart)
    cancelled_and_waited(served, job_id, waiting, waited)


def test_a_timeout_of_0_looks_once(served: ControlProc, follower: Any) -> None:
    # Given a job that has ended and one that runs
    done = follower["submit"]("noop")
    wait_until(lambda: served.get(done.id).state == jobs_pb2.Job.SUCCEEDED, 30, what="the noop to end")
    running = follower["submit"]("sleep", {"seconds": 30})

    # Then timeout=0 returns the ended (before: DeadlineExceeded "not finished after 0 s" for it too)
    assert follower["wait"](done.id, 0).state is JobState.SUCCEEDED
    assert [j.id for j in follower["wait_all"]([done.id], 0)] == [done.id]
    # and says at once that the other has not ended
    started = time.monotonic()
    with pytest.raises(corral.DeadlineExceeded, match="not finished after 0 s"):
        follower["wait"](running.id, 0)
    with pytest.raises(corral.DeadlineExceeded, match=r"^1 of 2 jobs not finished after 0 s \(the first: '"):
        follower["wait_all"]([done.id, running.id], 0)
    assert time.monotonic() - started < follow.CHECK_LIMIT_SEC, "a look must not wait for a change"


# run() sends a job on the client's kept RunJobs stream, or with a timeout in one RunJob call
RUN_WAYS = pytest.mark.parametrize("limit", [None, 60.0], ids=["kept-stream", "one-call"])


@RUN_WAYS
def test_run_rides_through_a_control_plane_restart_once_the_job_was_accepted(
    served: ControlProc, follower: Any, limit: float | None
) -> None:
    # Given a job run with run() that is running on its worker
    running, ran = in_thread(lambda: follower["run"]("sleep", {"seconds": 3}, timeout=limit))
    stats = jobs_pb2.GetStatsRequest()
    wait_until(lambda: served.jobs.GetStats(stats, timeout=10).running == 1, 30, what="the job to run")

    # When the control plane stops and comes back 1 s later, while the call is open
    restart(served, 1.0)

    # Then the call returns the job's end: it ran once, and was submitted once
    running.join(30)
    assert "error" not in ran, ran
    done = ran["value"]
    assert done.state is JobState.SUCCEEDED and done.attempts == 1
    assert served.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10).total == 1


@RUN_WAYS
def test_run_against_a_stopped_control_plane_raises_and_submits_nothing(
    served: ControlProc, follower: Any, limit: float | None
) -> None:
    assert served.stop() == 0
    started = time.monotonic()
    with pytest.raises(corral.Unavailable):
        follower["run"]("noop", timeout=limit)
    assert time.monotonic() - started < 15, "an unreachable control plane must be reported within seconds"
    served.start()
    assert served.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10).total == 0


def test_an_outage_past_the_limit_raises_unavailable(served: ControlProc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow, "OUTAGE_LIMIT_SEC", 1.0)
    job = corral.Client(served.address).submit("sleep", {"seconds": 30})
    seen = threading.Event()

    def watch() -> list[corral.Job]:
        with corral.Client(served.address, timeout=10) as client:
            updates = []
            for update in client.watch(job.id):
                updates.append(update)
                seen.set()
            return updates

    thread, out = in_thread(watch)
    assert seen.wait(30), "the watch saw no event"
    assert served.stop() == 0  # for good
    stopped = time.monotonic()
    thread.join(60)
    assert isinstance(out.get("error"), corral.Unavailable), out
    assert time.monotonic() - stopped < 30, "the watch never gave up"


def test_the_timeout_still_wins_over_an_outage(served: ControlProc, follower: Any) -> None:
    job = follower["submit"]("sleep", {"seconds": 30})
    wait_until(lambda: served.get(job.id).state == jobs_pb2.Job.RUNNING, what="the job to run")
    thread, out = in_thread(lambda: follower["wait"](job.id, 3.0))
    # Once the wait follows the job (it reached the control plane: a wait that never did is Unavailable,
    # see test_client_close_and_reach), the control plane goes away; both outage limits outlast 3 s
    wait_until(lambda: watched_jobs(served) >= 1, what="the wait to follow the job")
    assert served.stop() == 0
    thread.join(60)
    assert isinstance(out.get("error"), corral.DeadlineExceeded), out
    assert "not finished after 3 s" in str(out["error"])


def test_a_control_plane_that_cannot_be_reached_is_reported_within_seconds(served: ControlProc, follower: Any) -> None:
    job = follower["submit"]("noop")
    assert served.stop() == 0
    started = time.monotonic()
    with pytest.raises(corral.Unavailable):
        follower["wait"](job.id, 60)
    assert time.monotonic() - started < 15, "a wrong or dead address must not wait out the outage limit"
    started = time.monotonic()
    with pytest.raises(corral.Unavailable):
        follower["wait_all"]([job.id], 60)
    assert time.monotonic() - started < 15, "nor must a wait_all (whose stream carries no event until an end)"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_watch_on_a_connection_that_went_silent_watches_again_and_sees_the_end(
    served: ControlProc, kind: str
) -> None:
    with PartitionableRelay(served.port) as relay:
        # Given a client watching a 12 s job through a relay
        with corral.Client(served.address, timeout=10) as submitter:
            job_id = submitter.submit("sleep", {"seconds": 12}).id
        if kind == "sync":
            client = corral.Client(relay.address, timeout=10)
            thread, out = in_thread(lambda: list(client.watch(job_id)))
        else:

            async def watch() -> list[corral.Job]:
                async with corral.AsyncClient(relay.address, timeout=10) as c:
                    return [job async for job in c.watch(job_id)]

            thread, out = in_thread(lambda: asyncio.run(watch()))
        wait_until(lambda: relay.connections == 1, what="the watch to connect")
        wait_until(lambda: served.get(job_id).state == jobs_pb2.Job.RUNNING, what="the job to run")
        # When its connection goes silent both ways, with no FIN or RST (a partition)
        assert relay.cut() == 1
        # Then the client notices (keepalive), watches again on a new connection, and sees the job end
        # (before: the watch waited for ever on the dead connection). It takes a ping's interval and its
        # timeout (10.3 s measured on an idle machine); the wait is a guard against a hang, with room for
        # a loaded one (CI's parallel run once took past 15 s), not a bound on the time.
        wait_until(lambda: relay.connections >= 2, timeout=2 * KEEPALIVE_SEC + 20, what="the client to connect again")
        thread.join(30)
        assert not thread.is_alive() and "error" not in out, out
        assert out["value"][-1].state is JobState.SUCCEEDED
        if kind == "sync":
            client.close()
