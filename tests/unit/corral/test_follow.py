"""corral.follow: when a client watches a job again, and when it gives up."""

from __future__ import annotations

import math

import pytest

from corral import follow
from corral.errors import STANDBY_PREFIX, CorralError, DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from corral.failover import Failover
from corral.follow import Follow, FollowMany, broken_stream
from corral.job import Job, JobState

# What grpcio says for a stream whose connection the control plane closed (kill -9), for one it could
# not send at all (a port that refuses), and what a stopping control plane answers (its rich status).
SOCKET_CLOSED = "Stream removed (Socket closed)"
REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
    "Failed to connect to remote host: Connection refused"
)


def shutting_down() -> Unavailable:
    error = Unavailable("the control plane is shutting down: watch again once it is back (the job goes on)")
    error.answered = True
    return error


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def job(state: JobState, attempts: int = 1) -> Job:
    return Job(id="j1", type="noop", state=state, attempts=attempts)


def test_a_rewatch_repeats_nothing_that_did_not_change() -> None:
    f = Follow("j1")
    assert f.is_new(job(JobState.RUNNING))
    assert not f.is_new(job(JobState.RUNNING)), "the new stream's first event repeats the state"
    assert f.is_new(job(JobState.RUNNING, attempts=2)), "a new attempt in the same state is a change"
    assert f.is_new(job(JobState.SUCCEEDED, attempts=2))


def test_the_pause_doubles_up_to_its_cap_and_resets_on_an_event(clock: Clock) -> None:
    f = Follow("j1", clock=clock)
    f.is_new(job(JobState.PENDING))
    pauses = [f.pause(Unavailable("down")) for _ in range(6)]
    assert pauses == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    f.is_new(job(JobState.RUNNING))
    assert f.pause(None) == follow.REWATCH_PAUSE_SEC


def test_an_outage_longer_than_the_limit_raises_the_error(clock: Clock) -> None:
    f = Follow("j1", clock=clock)
    f.is_new(job(JobState.PENDING))
    down = Unavailable("connection refused")
    f.pause(down)
    clock.now += follow.OUTAGE_LIMIT_SEC - 1
    f.pause(down)  # still within the limit
    f.is_new(job(JobState.RUNNING))  # back: the outage is over
    clock.now += 10
    f.pause(down)  # a new outage starts counting here
    clock.now += follow.OUTAGE_LIMIT_SEC + 1
    with pytest.raises(Unavailable) as err:
        f.pause(down)
    assert err.value is down


def test_the_timeout_bounds_every_pause_and_then_raises(clock: Clock) -> None:
    f = Follow("j1", timeout=1.0, clock=clock)
    f.is_new(job(JobState.PENDING))
    assert f.remaining() == 1.0
    f.pause(Unavailable("down"))
    f.pause(Unavailable("down"))
    clock.now += 0.9
    assert f.pause(Unavailable("down")) == pytest.approx(0.1)
    clock.now += 0.1
    with pytest.raises(DeadlineExceeded, match=r"job 'j1' not finished after 1 s"):
        f.remaining()


def test_a_control_plane_never_reached_is_given_up_on_sooner(clock: Clock) -> None:
    f = Follow("j1", clock=clock)
    refused = Unavailable("failed to connect to all addresses")
    f.pause(refused)
    clock.now += follow.FIRST_CONTACT_LIMIT_SEC - 0.5
    f.pause(refused)  # a restart the follow started into may still end
    clock.now += 1.0
    with pytest.raises(Unavailable) as err:
        f.pause(refused)
    assert err.value is refused
    assert follow.FIRST_CONTACT_LIMIT_SEC < follow.OUTAGE_LIMIT_SEC


def test_only_the_control_plane_going_away_is_a_broken_stream() -> None:
    cancelled = CorralError("CANCELLED")
    cancelled.code = "CANCELLED"
    assert broken_stream(Unavailable("down")) and broken_stream(cancelled)
    assert not broken_stream(NotFound("job 'x' not found")) and not broken_stream(CorralError("boom"))


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "5", True])
def test_a_timeout_that_is_not_a_finite_number_of_seconds_is_refused(bad: object) -> None:
    # NaN compared false with every deadline: wait(timeout=nan) gave up at once saying "after nan s"
    with pytest.raises(InvalidArgument) as info:
        Follow("j", bad)  # type: ignore[arg-type]
    assert info.value.field == "timeout"
    assert Follow("j", None).remaining() is None and Follow("j", 5).remaining() is not None


def test_a_watch_of_many_asks_again_only_for_the_jobs_not_ended_and_repeats_nothing(clock: Clock) -> None:
    f = FollowMany(["a", "b", "c"], timeout=5.0, clock=clock)
    assert list(f.request().ids) == ["a", "b", "c"] and not f.request().ends_only
    a_running = Job(id="a", type="noop", state=JobState.RUNNING)
    b_done = Job(id="b", type="noop", state=JobState.SUCCEEDED)
    assert f.is_new(a_running) and f.is_new(b_done)
    # The stream broke: the next one names a and c, in the order given, and its first states repeat
    assert list(f.request().ids) == ["a", "c"]
    assert not f.is_new(a_running), "the new stream's first event repeats the state"
    assert f.is_new(Job(id="c", type="noop", state=JobState.FAILED))
    assert not f.done
    assert f.is_new(Job(id="a", type="noop", state=JobState.CANCELLED)) and f.done
    assert [(j.id, j.state) for j in f.ends()] == [
        ("a", JobState.CANCELLED),
        ("b", JobState.SUCCEEDED),
        ("c", JobState.FAILED),
    ]


def test_a_watch_of_many_that_runs_out_of_time_names_how_many_are_left(clock: Clock) -> None:
    f = FollowMany(["a", "b", "c"], timeout=2.0, ends_only=True, clock=clock)
    assert f.request().ends_only
    f.is_new(Job(id="b", type="noop", state=JobState.SUCCEEDED))
    clock.now += 2.5
    with pytest.raises(DeadlineExceeded, match=r"^2 of 3 jobs not finished after 2 s \(the first: 'a'\)$"):
        f.remaining()


@pytest.mark.parametrize(
    ("ids", "field", "rule"),
    [
        ("abc", "ids", "must be a list of job ids, got str"),
        ([], "ids", "must hold 1 to 10,000 job ids, got 0"),
        (["a"] * 10_001, "ids", "must hold 1 to 10,000 job ids, got 10,001"),
        (["a", 1], "ids[1]", "must be a string, got int"),
        (["a", ""], "ids[1]", "is required"),
        (["x" * 129], "ids[0]", "must be at most 128 characters, got 129"),
        (["a", "b", "a"], "ids[2]", "repeats ids[0] ('a'): name each job once"),
    ],
)
def test_a_bad_list_of_ids_is_refused_naming_the_entry(ids: object, field: str, rule: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        FollowMany(ids)  # type: ignore[arg-type]
    assert (err.value.field, str(err.value)) == (field, f"{field}: {rule}")


# -- contact without an event (WatchJobs with ends_only is silent until a job ends) ------------------


def given_up_after(f: Follow, clock: Clock, error: Unavailable) -> float:
    """Fail every rewatch with ``error``, pausing as told, until ``f`` gives up: the seconds that took."""
    start = clock.now
    with pytest.raises(Unavailable) as err:
        for _ in range(10_000):
            clock.now += f.pause(error)
    assert err.value is error
    return clock.now - start


def within_the_outage_limit(seconds: float) -> bool:
    """Whether a follow gave up as the outage limit says: after it, by at most one pause (and a stream)."""
    return follow.OUTAGE_LIMIT_SEC < seconds <= follow.OUTAGE_LIMIT_SEC + follow.REWATCH_PAUSE_MAX_SEC + 0.1


@pytest.mark.parametrize("broke", [Unavailable(SOCKET_CLOSED), shutting_down()], ids=["killed", "stopped"])
def test_a_stream_the_control_plane_took_is_contact_though_no_event_came(clock: Clock, broke: Unavailable) -> None:
    # Given a wait_all whose stream the control plane took, with no event yet (the jobs run)
    f = FollowMany(["a", "b"], ends_only=True, clock=clock)
    # When the control plane goes away (killed, or stopping) and then refuses every rewatch
    f.pause(broke)
    # Then it is given up on after the outage limit (before: the first-contact limit, 5 s)
    assert within_the_outage_limit(given_up_after(f, clock, Unavailable(REFUSED)))


def test_a_stream_served_a_while_gives_the_next_outage_the_whole_limit(clock: Clock) -> None:
    # Given a wait_all that rode through a restart, with no event before or after it
    f = FollowMany(["a"], ends_only=True, clock=clock)
    f.opening()
    clock.now += 1.0
    f.pause(shutting_down())
    for _ in range(4):
        clock.now += f.pause(Unavailable(REFUSED))
    f.opening()  # the control plane is back and takes the stream
    # When the control plane restarts again minutes later
    clock.now += 300.0
    f.pause(shutting_down())  # before: raised here, the outage counted from the first restart
    # Then this outage gets the whole limit
    assert within_the_outage_limit(given_up_after(f, clock, Unavailable(REFUSED)))


def test_a_stream_that_breaks_at_once_every_time_does_not_hold_off_the_limit(clock: Clock) -> None:
    # A server that takes every stream and fails it (a proxy in front of no control plane) is contact
    # (the address is right), but never served: the outage keeps counting, and is given up on.
    f = FollowMany(["a"], ends_only=True, clock=clock)
    failed_at_once = Unavailable("no healthy upstream")
    start = clock.now
    with pytest.raises(Unavailable) as err:
        for _ in range(10_000):
            f.opening()
            clock.now += 0.05
            clock.now += f.pause(failed_at_once)
    assert err.value is failed_at_once
    assert within_the_outage_limit(clock.now - start)


def test_a_stream_never_sent_is_no_contact_however_long_it_took(clock: Clock) -> None:
    # A wrong address that drops packets: each stream waits out a connect timeout, then gRPC says it
    # never sent it. That is not a stream served: the first-contact limit still holds.
    f = FollowMany(["a"], ends_only=True, clock=clock)
    timed_out = Unavailable(
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.1:1: Timeout occurred"
    )
    f.opening()
    clock.now += 20.0
    f.pause(timed_out)
    f.opening()
    clock.now += 20.0
    with pytest.raises(Unavailable):
        f.pause(timed_out)


def test_a_standby_or_a_list_that_passed_the_call_on_is_no_contact(clock: Clock) -> None:
    standby = Unavailable(f"{STANDBY_PREFIX}the active control plane is cp-a:50051")
    standby.answered = True
    failover = Failover(["cp-a:1", "cp-b:2"], lambda address: address)
    attempts = failover.attempts()
    attempts.failed("cp-a:1", Unavailable(REFUSED))
    attempts.failed("cp-b:2", standby)
    for error in (standby, attempts.exhausted()):
        f = FollowMany(["a"], ends_only=True, clock=clock)
        f.opening()
        clock.now += 10.0
        f.pause(error)
        clock.now += follow.FIRST_CONTACT_LIMIT_SEC + 0.5
        with pytest.raises(Unavailable):
            f.pause(error)


# -- timeout=0: look once ----------------------------------------------------------------------------


def test_a_timeout_of_0_looks_at_the_job_once(clock: Clock) -> None:
    # Before: remaining() raised before the first stream, so a job that had ended was never looked at
    done = Follow("j1", timeout=0, clock=clock)
    assert done.opening() == follow.CHECK_LIMIT_SEC
    assert done.is_new(job(JobState.SUCCEEDED))

    running = Follow("j1", timeout=0, clock=clock)
    assert running.opening() == follow.CHECK_LIMIT_SEC and not running.checked
    assert running.is_new(job(JobState.RUNNING)) and running.checked
    with pytest.raises(DeadlineExceeded, match=r"^job 'j1' not finished after 0 s$"):
        running.pause(None)


def test_only_the_first_stream_looks_past_the_deadline(clock: Clock) -> None:
    f = Follow("j1", timeout=1.0, clock=clock)
    assert f.opening() == 1.0
    f.is_new(job(JobState.RUNNING))
    clock.now += 0.5
    assert f.pause(Unavailable(SOCKET_CLOSED)) == pytest.approx(0.2)
    clock.now += 0.6
    with pytest.raises(DeadlineExceeded):
        f.opening()


def test_a_timeout_of_0_on_many_jobs_reads_each_once_and_yields_only_the_ends(clock: Clock) -> None:
    f = FollowMany(["a", "b", "c"], timeout=0, ends_only=True, clock=clock)
    assert f.opening() == follow.CHECK_LIMIT_SEC
    # The check asks for every job as it is now: one event each, so it knows when it has them all
    assert list(f.request().ids) == ["a", "b", "c"] and not f.request().ends_only
    assert not f.is_new(Job(id="a", type="noop", state=JobState.RUNNING)), "ends only: not yielded"
    assert f.is_new(Job(id="b", type="noop", state=JobState.SUCCEEDED))
    assert not f.checked
    assert f.is_new(Job(id="c", type="noop", state=JobState.FAILED))
    assert f.checked and not f.done
    with pytest.raises(DeadlineExceeded, match=r"^1 of 3 jobs not finished after 0 s \(the first: 'a'\)$"):
        f.pause(None)

    ended = FollowMany(["a", "b"], timeout=0, ends_only=True, clock=clock)
    ended.opening()
    for job_id in ("a", "b"):
        assert ended.is_new(Job(id=job_id, type="noop", state=JobState.SUCCEEDED))
    assert ended.done and [j.id for j in ended.ends()] == ["a", "b"]
