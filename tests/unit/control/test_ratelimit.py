"""Submission rate limits: the token bucket and the global / per-client limiter, on a FakeClock.

Each test reads Given / When / Then; time moves only through ``clock.advance``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.admission.ratelimit import SubmitRateLimiter, TokenBucket, default_burst
from control.clock import FakeClock
from control.config import ConfigError, ControlConfig
from corral.errors import InvalidArgument, RateLimited

# ---- TokenBucket ----------------------------------------------------------------------------------


def test_a_bucket_starts_full_then_refills_at_its_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=3, now=clock.now())
    # Given a full bucket of 3, when 3 are taken, then the 4th waits half a second (2 a second)
    assert all(bucket.take(1, clock.now()) for _ in range(3))
    assert not bucket.take(1, clock.now())
    assert bucket.wait(1, clock.now()) == pytest.approx(0.5)
    clock.advance(0.25)
    assert not bucket.take(1, clock.now()) and bucket.wait(1, clock.now()) == pytest.approx(0.25)
    clock.advance(0.25)
    assert bucket.take(1, clock.now())


def test_take_is_all_or_nothing_and_never_beyond_the_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=5, now=clock.now())
    assert bucket.take(3, clock.now())
    # When 3 are asked for with 2 left, none are taken
    assert not bucket.take(3, clock.now())
    assert bucket.available(clock.now()) == pytest.approx(2)
    # A long quiet spell refills up to the burst only; more than the burst can never be had
    clock.advance(3600)
    assert bucket.available(clock.now()) == 5 and bucket.full(clock.now())
    assert bucket.wait(6, clock.now()) == math.inf and not bucket.take(6, clock.now())


def test_float_steps_do_not_lose_a_token() -> None:
    # 0.1 s at 10/s is 0.9999999999... tokens in floating point: still one token
    clock = FakeClock(0.0)
    bucket = TokenBucket(rate=10.0, burst=1, now=clock.now())
    for _ in range(100):
        assert bucket.take(1, clock.now())
        clock.advance(0.1)


def test_a_clock_that_steps_back_refills_nothing() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=1, now=clock.now())
    assert bucket.take(1, clock.now())
    clock.advance(-30)
    assert not bucket.take(1, clock.now())
    clock.advance(1)  # one second after the step back: one token, not 31
    assert bucket.take(1, clock.now()) and not bucket.take(1, clock.now())


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (math.nan, 1), (1, 0), (1, math.inf)])
def test_a_bucket_refuses_a_bad_rate_or_burst(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match=r"^(rate|burst) must be"):
        TokenBucket(rate, burst, 0.0)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 50),
    burst=st.integers(1, 10),
    steps=st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 4)), min_size=1, max_size=200),
)
def test_never_more_than_burst_plus_rate_times_the_window(
    rate: float, burst: int, steps: list[tuple[float, int]]
) -> None:
    # Whatever the pattern of requests, what a bucket grants in any window [a, b] is at most
    # burst + rate * (b - a): the property every limit in Corral relies on.
    clock = FakeClock(0.0)
    bucket = TokenBucket(rate, burst, clock.now())
    granted: list[tuple[float, int]] = []
    for dt, n in steps:
        clock.advance(dt)
        if bucket.take(n, clock.now()):
            granted.append((clock.now(), n))
    for i, (start, _) in enumerate(granted):
        total = 0
        for t, n in granted[i:]:
            total += n
            assert total <= burst + rate * (t - start) + 1e-6


# ---- SubmitRateLimiter ----------------------------------------------------------------------------


def test_off_by_default_and_free() -> None:
    limiter = SubmitRateLimiter(FakeClock())
    assert not limiter.enabled and not limiter.per_client
    for _ in range(1000):
        limiter.admit("c", 10_000, batch=True)


def test_over_the_global_limit_is_rate_limited_with_when_to_retry() -> None:
    clock = FakeClock()
    limiter = SubmitRateLimiter(clock, per_min=60, burst=5)
    for _ in range(5):
        limiter.admit("a", 1)
    # When a 6th job comes at once, it is refused with the delay of one token (60/min = 1 s)
    with pytest.raises(RateLimited) as info:
        limiter.admit("b", 1)
    assert info.value.retry_after == pytest.approx(1.0)
    assert "global limit of 60 jobs/min" in info.value.message
    # Then honouring the delay works
    clock.advance(info.value.retry_after)
    limiter.admit("b", 1)


def test_a_batch_counts_its_jobs_all_or_nothing() -> None:
    clock = FakeClock()
    limiter = SubmitRateLimiter(clock, per_min=60, burst=10)
    limiter.admit("a", 7, batch=True)
    # Given 3 tokens left, a batch of 4 is refused whole: it waits for the 1 missing token
    with pytest.raises(RateLimited) as info:
        limiter.admit("a", 4, batch=True)
    assert info.value.retry_after == pytest.approx(1.0)
    # and took nothing: a batch of 3 still fits
    limiter.admit("a", 3, batch=True)


def test_a_batch_larger_than_the_burst_can_never_fit_and_says_so() -> None:
    limiter = SubmitRateLimiter(FakeClock(), per_min=600, burst=100)
    with pytest.raises(InvalidArgument) as info:
        limiter.admit("a", 101, batch=True)
    assert info.value.field == "jobs"
    assert "can never fit" in info.value.rule and "at most 100 jobs per batch" in info.value.rule
    limiter.admit("a", 100, batch=True)  # the refusal took nothing


def test_each_client_has_its_own_bucket_under_the_global_one() -> None:
    clock = FakeClock()
    limiter = SubmitRateLimiter(clock, per_min=600, burst=100, client_per_min=60, client_burst=3)
    assert limiter.per_client
    limiter.admit("ipv4:10.0.0.1", 3)
    # When client 1 is out of tokens it is refused, naming the per-client limit
    with pytest.raises(RateLimited) as info:
        limiter.admit("ipv4:10.0.0.1", 1)
    assert "per-client limit" in info.value.message and "ipv4:10.0.0.1" in info.value.message
    # Client 2 is not slowed by client 1
    limiter.admit("principal:bob", 3)
    # and the refused call took nothing from the global bucket: 94 left of 100
    limiter.admit("principal:carol", 3)
    assert limiter.global_bucket is not None
    assert limiter.global_bucket.available(clock.now()) == pytest.approx(91)


def test_retry_after_is_when_both_buckets_have_room() -> None:
    clock = FakeClock()
    # The global bucket (6/min: one per 10 s) is the slower one here
    limiter = SubmitRateLimiter(clock, per_min=6, burst=2, client_per_min=60, client_burst=2)
    limiter.admit("a", 2)
    with pytest.raises(RateLimited) as info:
        limiter.admit("a", 1)
    assert info.value.retry_after == pytest.approx(10.0)
    assert "global limit" in info.value.message


def test_idle_clients_are_forgotten_and_the_table_is_bounded() -> None:
    clock = FakeClock()
    limiter = SubmitRateLimiter(clock, client_per_min=60, client_burst=2, max_clients=50)
    for i in range(10):
        limiter.admit(f"c{i}", 1)
    assert len(limiter) == 10
    # Once their buckets are full again, forgetting them changes nothing: later calls drop them
    clock.advance(5)
    for _ in range(10):
        limiter.admit("busy", 1)
        clock.advance(1)
    assert len(limiter) == 1
    # Many distinct callers never hold more than max_clients buckets
    for i in range(200):
        limiter.admit(f"n{i}", 1)
    assert len(limiter) <= 50


def test_callers_refused_by_the_global_limit_leave_no_bucket_behind() -> None:
    clock = FakeClock()
    limiter = SubmitRateLimiter(clock, per_min=60, client_per_min=60, max_clients=10)
    limiter.admit("a", 60)  # the global bucket is empty now
    # Given a flood of new callers while nobody gets through, the table stays within max_clients: a
    # refused call made a bucket that no later admitted call pruned, one per caller without end.
    for i in range(1000):
        with pytest.raises(RateLimited, match="global limit"):
            limiter.admit(f"n{i}", 1)
    assert len(limiter) <= 10
    # and a refused newcomer was charged nothing: once the global bucket refills, its own is full
    clock.advance(60)
    limiter.admit("n0", 60)


def test_default_burst_is_a_minute_of_the_rate() -> None:
    assert default_burst(60) == 60 and default_burst(0.5) == 1 and default_burst(2.5) == 3
    limiter = SubmitRateLimiter(FakeClock(), per_min=30)
    assert limiter.global_bucket is not None and limiter.global_bucket.burst == 30


# ---- configuration --------------------------------------------------------------------------------


def test_rate_limit_settings_are_read_from_the_environment() -> None:
    cfg = ControlConfig.from_env(
        {
            "RATE_LIMIT_JOBS_PER_MIN": "120",
            "CORRAL_RATE_LIMIT_BURST": "20",
            "CORRAL_RATE_LIMIT_PER_CLIENT_JOBS_PER_MIN": "30",
            "CORRAL_RATE_LIMIT_PER_CLIENT_BURST": "5",
        }
    )
    assert (cfg.rate_limit_jobs_per_min, cfg.rate_limit_burst) == (120, 20)
    assert (cfg.rate_limit_per_client_jobs_per_min, cfg.rate_limit_per_client_burst) == (30, 5)


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("RATE_LIMIT_JOBS_PER_MIN", "-1", "RATE_LIMIT_JOBS_PER_MIN must be >= 0, got -1.0"),
        ("RATE_LIMIT_JOBS_PER_MIN", "lots", "RATE_LIMIT_JOBS_PER_MIN must be a number, got 'lots'"),
        ("RATE_LIMIT_JOBS_PER_MIN", "inf", "RATE_LIMIT_JOBS_PER_MIN must be a finite number, got 'inf'"),
        ("CORRAL_RATE_LIMIT_BURST", "-5", "CORRAL_RATE_LIMIT_BURST must be >= 0, got -5"),
        ("CORRAL_RATE_LIMIT_BURST", "2.5", "CORRAL_RATE_LIMIT_BURST must be an integer, got '2.5'"),
        ("CORRAL_RATE_LIMIT_PER_CLIENT_JOBS_PER_MIN", "-0.1", "CORRAL_RATE_LIMIT_PER_CLIENT_JOBS_PER_MIN must be >= 0"),
        ("CORRAL_RATE_LIMIT_PER_CLIENT_BURST", "-1", "CORRAL_RATE_LIMIT_PER_CLIENT_BURST must be >= 0, got -1"),
    ],
)
def test_bad_rate_limit_settings_stop_start_up_naming_the_variable(var: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ControlConfig.from_env({var: value})
    assert str(info.value).startswith(message)
