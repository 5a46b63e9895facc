"""Sharing a machine's GPUs out among local workers, and the setting that gives a worker its share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from corral.limits import MAX_GPUS
from corral.resources import gpus_setting, parse_gpus, share_gpus

DEVICES = st.lists(st.sampled_from([*map(str, range(8)), "GPU-a", "GPU-b", "7x"]), unique=True, max_size=MAX_GPUS)


@given(DEVICES, st.integers(1, 10))
def test_shares_are_disjoint_runs_in_order_that_differ_by_at_most_one(devices: list[str], workers: int) -> None:
    shares = share_gpus(tuple(devices), workers)
    assert len(shares) == workers
    assert [d for share in shares for d in share] == devices
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@given(DEVICES)
def test_the_setting_of_a_share_reads_back_as_exactly_that_share(devices: list[str]) -> None:
    assert parse_gpus(gpus_setting(tuple(devices))) == tuple(devices)


def test_a_bare_number_is_a_count_and_one_index_takes_a_comma() -> None:
    assert (parse_gpus("3"), parse_gpus("3,"), parse_gpus(" 3 , "), gpus_setting(("3",))) == (
        ("0", "1", "2"),
        ("3",),
        ("3",),
        "3,",
    )
