"""A job whose deadline passes while it waits for its slot's replacement runner process (after the
runner before it crashed) never ran: it is handed back, at no attempt, and runs once a runner is ready.

Before, it ended ``FAILED TIMEOUT: deadline passed before start (it waited 2 s for a runner process)``,
charged an attempt for a crash that was another job's. Its deadline still counts from the assignment,
as the control plane's lease does (which expires at that deadline plus a grace the worker does not
know): a job that did start is still stopped at its deadline.
"""

from __future__ import annotations

from collections.abc import Callable

from corral import Client
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc
from tests.support.calls import submit, wait_done
from tests.support.cli import corral

S = jobs_pb2.Job
IMPORT_SEC = 3.0
"""How long the plug-in takes to import, in every runner process: longer than the job's timeout."""


def test_a_job_that_waits_past_its_deadline_for_a_replacement_runner_is_handed_back_and_runs_later(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given a one-slot worker whose plug-in takes 3 s to import into each runner process
    cp = control_plane
    spawn_worker(
        cp,
        slots=1,
        imports=("tests.support.plugin_slow", "tests.support.jobtypes"),
        env={"CORRAL_TEST_IMPORT_SEC": str(IMPORT_SEC)},
    )
    # And a job that crashed its runner (its replacement now takes 3 s to start)
    crashed = wait_done(cp, submit(cp, "crash", {"how": "segv"}, max_attempts=1).id)
    assert (crashed.state, crashed.error.code) == (S.FAILED, "CRASHED"), crashed.error
    # When the next job, with a 2 s timeout and one attempt, comes to that slot at once
    innocent = submit(cp, "noop", timeout_sec=2, max_attempts=1)
    done = wait_done(cp, innocent.id, timeout=60)
    # Then it was handed back (no attempt spent: it had one) and ran on the ready runner
    assert done.state == S.SUCCEEDED, (done.error.code, done.error.message)
    requeued = [e for e in cp.events("job_requeued") if e.get("job_id") == innocent.id]
    assert requeued and all(e["reason"] == "HANDED_BACK" for e in requeued), requeued
    # And its record says so: more attempts than max_attempts, of which only the one that ran is charged
    assert (done.attempts, done.charged_attempts, done.max_attempts) == (1 + len(requeued), 1, 1)
    with Client(cp.address) as client:
        assert client.get(innocent.id).uncharged_attempts == len(requeued)
    shown = corral("get", innocent.id, "--control", cp.address)
    assert f"{len(requeued)} not charged" in shown.stdout, shown.stdout


def test_a_job_that_started_is_still_stopped_at_its_deadline(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given a worker with a ready runner
    cp = control_plane
    spawn_worker(cp, slots=1)
    # When a job runs past its timeout
    done = wait_done(cp, submit(cp, "sleep", {"seconds": 30}, timeout_sec=1, max_attempts=1).id)
    # Then it is stopped and reported TIMEOUT, an attempt spent, as ever
    assert (done.state, done.error.code, done.attempts) == (S.FAILED, "TIMEOUT", 1), done.error
    assert "timeout of 1 s passed" in done.error.message, done.error.message
