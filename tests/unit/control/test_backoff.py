"""Retry backoff: capped 2^n with full jitter, for any attempt number."""

import random

from hypothesis import given
from hypothesis import strategies as st

from control.backoff import backoff_ceiling, retry_delay


@given(
    attempt=st.integers(min_value=-5, max_value=10**6),
    base=st.floats(min_value=0.001, max_value=60),
    cap=st.floats(min_value=0.001, max_value=3600),
    seed=st.integers(0, 2**32),
)
def test_delay_is_between_zero_and_cap_for_any_attempt(attempt: int, base: float, cap: float, seed: int) -> None:
    delay = retry_delay(attempt, base=base, cap=cap, rng=random.Random(seed))
    assert 0.0 <= delay <= cap


def test_ceiling_doubles_then_caps() -> None:
    assert [backoff_ceiling(n, base=1, cap=300) for n in range(1, 12)] == [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300,
    ]  # fmt: skip
    assert backoff_ceiling(10**6, base=1, cap=300) == 300
    assert backoff_ceiling(2**62, base=0.5, cap=10) == 10


def test_jitter_is_deterministic_under_a_seed() -> None:
    a = [retry_delay(n, base=1, cap=60, rng=random.Random(42)) for n in range(1, 8)]
    b = [retry_delay(n, base=1, cap=60, rng=random.Random(42)) for n in range(1, 8)]
    assert a == b


def test_zero_base_means_no_wait() -> None:
    assert retry_delay(3, base=0, cap=10, rng=random.Random(1)) == 0.0
