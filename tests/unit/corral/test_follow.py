"""corral.follow: when a client watches a job again, and when it gives up."""

from __future__ import annotations

import math

import pytest

from corral import follow
from corral.errors import CorralError, DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from corral.follow import Follow, FollowMany, broken_stream
from corral.job import Job, JobState


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
