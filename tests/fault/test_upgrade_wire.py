"""A rolling upgrade: workers of one release and a control plane of another, for a while.

Workers are rolled one at a time, so old workers talk to an upgraded control plane; when the control
plane is upgraded last, current workers talk to an old one. Each side leaves unset what the other's
release added: an old worker sends no ``registered_since`` (39dcae3), ``gpus``/``memory_mb`` (a1782c0) or
result ``output`` (9440908); an old control plane sends no ``heartbeat_timeout_sec`` and ``registered_at``
(65684e5, 39dcae3). On the wire an unset field is an absent one, so these tests send exactly what such a
peer sends (``tests/support/old_peers.py``; ``tests/support/fake_control.py`` for the control plane).

They guard what held when they were written (the same was seen with real old releases, 8f1c9f1 and
9a0217a, against this one: jobs of several types, a timeout, a cancel, restarts by SIGTERM and kill -9
while jobs ran): nothing is lost, nothing runs twice, and what degrades does so as the older release did.
"""

from __future__ import annotations

import pytest

from corral.v1 import jobs_pb2
from corral.v1 import workers_pb2 as pb
from tests.conftest import ControlProc, wait_until
from tests.support.calls import submit, wait_done
from tests.support.fake_control import FakeControl, job, run_agent
from tests.support.old_peers import OldWorker
from worker import Agent

S = jobs_pb2.Job


def test_an_old_worker_runs_jobs_and_is_re_adopted_after_the_control_plane_restarts(control_plane: ControlProc) -> None:
    # Given a worker of an older release on the current control plane
    cp = control_plane
    old = OldWorker(cp.channel(), "old-w")
    registered = old.next("registered").registered
    assert registered.heartbeat_timeout_sec > 0 and registered.registered_at > 0  # which it does not read
    first, second = submit(cp, "noop"), submit(cp, "noop")
    assigned: set[tuple[str, int]] = set()
    while len(assigned) < 2:
        assigned |= {(a.job_id, a.attempt) for a in old.next("assign").assign.assignments}
    assert assigned == {(first.id, 1), (second.id, 1)}
    # When it reports a result without output, as its release did
    old.result(first.id, 1)
    done = wait_done(cp, first.id)
    # Then the job ends as it says, with nothing printed
    assert (done.state, done.attempts, done.output, dict(done.result)) == (S.SUCCEEDED, 1, "", {"old": True})
    # When the control plane restarts while the old worker runs the other job
    cp.stop()
    old.close()
    cp.start()
    back = OldWorker(cp.channel(), "old-w", running=[(second.id, 1)])
    # Then it keeps that attempt (no registered_since needed), and its result ends the job: run once
    assert [(a.job_id, a.attempt) for a in back.next("registered").registered.adopted] == [(second.id, 1)]
    back.result(second.id, 1)
    done = wait_done(cp, second.id)
    back.close()
    assert (done.state, done.attempts, done.worker_id) == (S.SUCCEEDED, 1, "old-w")


@pytest.mark.parametrize("release", ["old", "current"])
def test_an_assignment_lost_on_its_way_to_an_old_worker_costs_its_job_an_attempt(
    control_plane: ControlProc, release: str
) -> None:
    # Given a job of one attempt leased to a worker, whose assignment the worker never got (lost with
    # the stream: the worker saw the message, the test lets it count as not received)
    cp = control_plane
    worker = OldWorker(cp.channel(), "w-lost")
    since = worker.next("registered").registered.registered_at
    lost = submit(cp, "noop", max_attempts=1)
    assert [a.job_id for a in worker.next("assign").assign.assignments] == [lost.id]
    worker.close()
    # When the worker registers again without it: an old one says nothing of since when it held its id
    again = OldWorker(cp.channel(), "w-lost", registered_since=since if release == "current" else 0.0)
    again.next("registered")
    try:
        if release == "current":
            # Then for a current worker the attempt never reached it: back in line, at no cost, run once
            assignment = again.next("assign").assign.assignments[0]
            assert (assignment.job_id, assignment.attempt) == (lost.id, 2)
            again.result(lost.id, 2)
            done = wait_done(cp, lost.id)
            assert (done.state, done.attempts) == (S.SUCCEEDED, 2)
            assert [e["reason"] for e in cp.events("job_requeued")] == ["NOT_RECEIVED"]
        else:
            # Then for an old worker it counts as lost with the worker (as with its own release): the job's
            # one attempt is spent and it ends in the dead-letter queue, never run twice
            done = wait_done(cp, lost.id)
            assert (done.state, done.attempts, done.error.code) == (S.FAILED, 1, "WORKER_LOST")
            assert cp.events("job_requeued") == []
    finally:
        again.close()


def test_a_current_worker_works_with_an_old_control_plane_and_takes_the_new_fields_once_it_is_upgraded() -> None:
    async def body(control: FakeControl, agent: Agent) -> None:
        # Given a current worker on a control plane of a release before the stand-still check and the
        # registration time: its Registered has neither
        s = await control.session()
        assert (await s.next("register")).registered_since == 0
        s.registered(interval=0.05)
        s.assign(job("j1", "sleep", {"seconds": 1.0}))
        # Then it runs the job and heartbeats, never counting itself stood still (no timeout was said)
        heartbeat = await s.next("heartbeat")
        while not heartbeat.running:
            heartbeat = await s.next("heartbeat")
        assert [(r.job_id, r.attempt) for r in heartbeat.running] == [("j1", 1)]
        assert agent.connection is not None and agent.connection.stalls == 0
        # When that control plane is upgraded (stopped, started again) while the job runs
        await control.stop()
        await control.start()
        s = await control.session()
        register = await s.next("register")
        # Then it lists the job it runs, still with no registration time (it was never given one)
        assert [(r.job_id, r.attempt) for r in register.running] == [("j1", 1)]
        assert register.registered_since == 0
        s.registered(
            interval=0.05,
            heartbeat_timeout_sec=5.0,
            registered_at=1234.5,
            adopted=[pb.AttemptRef(job_id="j1", attempt=1)],
        )
        # and the job's result comes over the new session, once
        results = await s.results(1)
        assert [(key, r.outcome) for key, r in results.items()] == [(("j1", 1), pb.JobResult.SUCCEEDED)]
        # and from then on it sends back the time the upgraded control plane gave it
        await control.stop()
        await control.start()
        s = await control.session()
        again = await s.next("register")
        assert again.registered_since == 1234.5
        assert [(r.job_id, r.attempt) for r in again.finished] == [("j1", 1)]  # never acknowledged

    run_agent(body)


def test_an_old_worker_registering_with_the_old_fields_only_is_shown_as_it_is(control_plane: ControlProc) -> None:
    # Given an old worker, which says nothing of GPUs or memory
    old = OldWorker(control_plane.channel(), "old-shown")
    try:
        old.next("registered")
        # Then it is listed with none, and gets no job that asks for them
        wait_until(lambda: [w.id for w in control_plane.workers()] == ["old-shown"])
        (shown,) = control_plane.workers()
        assert (shown.threads, shown.slots, shown.gpus, shown.memory_mb) == (2, 2, 0, 0)
        gpu = submit(control_plane, "noop", gpu_count=1)
        plain = submit(control_plane, "noop")
        assert [a.job_id for a in old.next("assign").assign.assignments] == [plain.id]
        assert control_plane.get(gpu.id).state == S.PENDING
    finally:
        old.close()
