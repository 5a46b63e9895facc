"""A change whose commit is held up is shown to nobody until it is committed, so that a crash in
between undoes nothing a client saw. Real control plane on the session's PostgreSQL cluster, where
every commit is a round trip: another session's table lock holds it up, as a long ``ALTER`` or a
lock-taking migration would."""

from __future__ import annotations

import grpc
import psycopg
import pytest

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc
from tests.support.calls import request, submit_many

S = jobs_pb2.Job
HELD_SEC = 1.0
"""How long a call is given to answer while the commit is held: it must not, however long it waits."""


def _gives_no_answer(call: grpc.UnaryUnaryMultiCallable, req: object) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call(req, timeout=HELD_SEC)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_cancel_held_up_in_its_commit_is_shown_to_nobody_and_a_kill_9_then_undoes_nothing_seen(
    shared_pair: tuple[ControlProc, ControlProc, str],
) -> None:
    first, _, url = shared_pair
    # Given two queued jobs (no worker), stored
    kept, cancelled = submit_many(first, [request("noop"), request("noop")])
    with psycopg.connect(url) as blocker:
        # When a CancelJob's commit is held up by a lock on the jobs table
        blocker.execute("LOCK TABLE jobs IN EXCLUSIVE MODE")
        _gives_no_answer(first.jobs.CancelJob, jobs_pb2.CancelJobRequest(id=cancelled.id))
        # Then neither a GetJob nor a WatchJob shows the cancel while it could still be undone
        _gives_no_answer(first.jobs.GetJob, jobs_pb2.GetJobRequest(id=cancelled.id))
        watch = first.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=cancelled.id), timeout=HELD_SEC)
        with pytest.raises(grpc.RpcError) as err:
            next(watch)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # while a job with nothing on its way to the store answers at once
        assert first.jobs.GetJob(jobs_pb2.GetJobRequest(id=kept.id), timeout=10).state == S.PENDING
        blocker.rollback()
    # and once the lock goes, the cancel is committed and shown
    assert first.jobs.GetJob(jobs_pb2.GetJobRequest(id=cancelled.id), timeout=10).state == S.CANCELLED

    with psycopg.connect(url) as blocker:
        # When the control plane is killed while another cancel is held up in its commit
        blocker.execute("LOCK TABLE jobs IN EXCLUSIVE MODE")
        _gives_no_answer(first.jobs.CancelJob, jobs_pb2.CancelJobRequest(id=kept.id))
        _gives_no_answer(first.jobs.GetJob, jobs_pb2.GetJobRequest(id=kept.id))
        first.kill()
        blocker.rollback()
    # Then after a restart the job is as every reader was shown it: queued, not cancelled
    first.start()
    assert first.jobs.GetJob(jobs_pb2.GetJobRequest(id=kept.id), timeout=10).state == S.PENDING
    assert first.jobs.GetJob(jobs_pb2.GetJobRequest(id=cancelled.id), timeout=10).state == S.CANCELLED
