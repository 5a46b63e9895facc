"""The job state machine: allowed transitions, fencing, retry budget."""

import pytest

from control import jobs
from control.jobs import ALLOWED, JobRecord, JobState
from corral.errors import FailedPrecondition, StaleAttempt


def state(job: JobRecord) -> JobState:
    return job.state


def make(max_attempts: int = 3, scheduled_at: float | None = None) -> JobRecord:
    job = JobRecord(id="j1", type="noop", payload_json="{}", created_at=100.0, max_attempts=max_attempts,
                    scheduled_at=scheduled_at)  # fmt: skip
    jobs.new_job(job, 100.0)
    return job


def test_new_job_is_pending_or_scheduled() -> None:
    assert make().state is JobState.PENDING
    later = make(scheduled_at=200.0)
    assert later.state is JobState.SCHEDULED
    assert later.ready_at == 200.0


def test_lease_issues_a_new_fencing_token_each_time() -> None:
    job = make()
    assert jobs.lease(job, "w1", 2, now=101.0, grace=5) == 1
    assert job.state is JobState.RUNNING
    assert job.queue_seconds == pytest.approx(1.0)
    assert job.lease_expires_at == pytest.approx(101.0 + job.timeout_sec + 5)
    assert jobs.fail_attempt(job, 1, jobs.ERROR, "boom", now=102.0, delay=0.5)
    assert state(job) is JobState.SCHEDULED
    jobs.promote(job, 103.0)
    assert jobs.lease(job, "w2", 1, now=103.0, grace=5) == 2


def test_stale_attempt_is_rejected_and_changes_nothing() -> None:
    job = make()
    jobs.lease(job, "w1", 1, now=101.0, grace=5)
    jobs.fail_attempt(job, 1, jobs.WORKER_LOST, "lost", now=102.0, delay=0)
    jobs.promote(job, 102.0)
    jobs.lease(job, "w2", 1, now=102.0, grace=5)
    before = (job.state, job.attempts, job.worker_id, job.result_json)
    with pytest.raises(StaleAttempt):
        jobs.succeed(job, 1, '{"late": true}', now=103.0, exec_seconds=1)
    assert (job.state, job.attempts, job.worker_id, job.result_json) == before


def test_attempts_exhausted_goes_to_failed_then_redrive() -> None:
    job = make(max_attempts=2)
    for attempt in (1, 2):
        jobs.lease(job, "w", 1, now=100.0 + attempt, grace=1)
        retry = jobs.fail_attempt(job, attempt, jobs.ERROR, "x", now=100.5 + attempt, delay=0)
        if retry:
            jobs.promote(job, 101.0 + attempt)
    assert job.state is JobState.FAILED
    assert job.finished_at is not None
    jobs.redrive(job, 110.0)
    assert state(job) is JobState.PENDING
    assert job.charged_attempts == 0
    assert jobs.lease(job, "w", 1, now=111.0, grace=1) == 3


def test_hand_back_does_not_charge_an_attempt() -> None:
    job = make(max_attempts=1)
    jobs.lease(job, "w", 1, now=101.0, grace=1)
    jobs.hand_back(job, 1, now=102.0)
    assert job.state is JobState.PENDING
    assert job.charged_attempts == 0


def test_terminal_states_allow_nothing_but_redrive_and_revival() -> None:
    assert ALLOWED[JobState.SUCCEEDED] == frozenset()
    assert ALLOWED[JobState.CANCELLED] == frozenset({JobState.SCHEDULED})
    job = make()
    jobs.cancel(job, 101.0)
    with pytest.raises(FailedPrecondition):
        jobs.cancel(job, 102.0)
    with pytest.raises(FailedPrecondition):
        jobs.redrive(job, 102.0)
    # a job cancelled by request stays cancelled: only a failed dependency's cancellation is undone
    with pytest.raises(FailedPrecondition, match="not cancelled for a failed dependency"):
        jobs.revive(job, 102.0, frozenset({"dep"}))
    assert job.state is JobState.CANCELLED


def test_a_job_cancelled_for_a_failed_dependency_waits_again_when_it_is_retried() -> None:
    job = make(scheduled_at=200.0)
    job.waiting_on = frozenset({"dep"})
    jobs.cancel(job, 101.0, jobs.DEPENDENCY_FAILED, "job 'dep', which it depends on, ended FAILED")
    jobs.revive(job, 150.0, frozenset({"dep"}))
    assert (job.state, job.waiting_on) == (JobState.SCHEDULED, frozenset({"dep"}))
    assert (job.error_code, job.error_message) == ("", "")
    assert (job.finished_at, job.ready_at, job.attempts) == (None, 200.0, 0)
