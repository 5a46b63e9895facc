"""The queue view: places match a full sort of the queue whatever the filters and paging, and the
estimated starts follow the measured drain rate."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.queue import QueueOrder
from control.queue_view import WINDOW_SEC, DrainRate, queue_page


@dataclass
class Queued:
    """The fields of a PENDING job that the view reads."""

    id: str
    priority: int
    ready_at: float
    seq: int
    type: str = "noop"
    owner: str = ""


def started(rate: float, now: float = 1000.0) -> DrainRate:
    """A drain rate of ``rate`` jobs a second, as of ``now``: one pass ten seconds ago."""
    drain = DrainRate()
    drain.started(now - 10.0, round(rate * 10))
    return drain


# ---- DrainRate ------------------------------------------------------------------------------------


def test_no_start_yet_is_no_rate() -> None:
    assert DrainRate().per_second(1000.0) == 0.0


def test_the_rate_is_the_window_s_starts_over_the_time_since_the_oldest() -> None:
    drain = DrainRate()
    drain.started(100.0, 3)
    drain.started(104.0, 5)
    drain.started(104.5, 0)  # a pass that placed nothing is not a start
    assert drain.per_second(110.0) == pytest.approx(8 / 10)
    # While nothing starts, the rate falls
    assert drain.per_second(200.0) == pytest.approx(8 / 100)


def test_a_burst_counts_over_at_least_a_second() -> None:
    drain = DrainRate()
    drain.started(100.0, 50)
    assert drain.per_second(100.0) == 50.0


def test_starts_older_than_the_window_no_longer_count() -> None:
    drain = DrainRate()
    drain.started(0.0, 1000)
    drain.started(WINDOW_SEC, 2)
    assert drain.per_second(WINDOW_SEC + 1.0) == pytest.approx(2 / 1.0)
    assert drain.per_second(3 * WINDOW_SEC) == 0.0


def test_only_the_newest_passes_are_kept_and_counted() -> None:
    drain = DrainRate(max_passes=3)
    for t in range(10):
        drain.started(float(t), t + 1)  # passes of 1..10 jobs
    # Kept: the passes at 7, 8 and 9 (8 + 9 + 10 jobs)
    assert drain.per_second(9.0) == pytest.approx(27 / 2)


@pytest.mark.parametrize(("window", "passes"), [(0.0, 10), (-1.0, 10), (60.0, 0)])
def test_bad_settings_are_refused(window: float, passes: int) -> None:
    with pytest.raises(ValueError, match="window_sec must be > 0 and max_passes >= 1"):
        DrainRate(window, passes)


# ---- queue_page -----------------------------------------------------------------------------------


def test_places_follow_priority_then_ready_time_and_starts_follow_the_rate() -> None:
    jobs = [
        Queued("a", priority=0, ready_at=1.0, seq=1),
        Queued("b", priority=5, ready_at=2.0, seq=2),
        Queued("c", priority=5, ready_at=1.5, seq=3),
        Queued("d", priority=1, ready_at=0.5, seq=4),
    ]
    page = queue_page(jobs, QueueOrder(), started(rate=2.0), now=1000.0)  # type: ignore[arg-type]
    assert [(q.job.id, q.position) for q in page.jobs] == [("c", 1), ("b", 2), ("d", 3), ("a", 4)]
    assert [q.estimated_start for q in page.jobs] == [1000.5, 1001.0, 1001.5, 1002.0]
    assert page.total == 4


def test_without_a_rate_there_is_no_estimate_but_still_a_place() -> None:
    jobs = [Queued("a", 0, 1.0, 1), Queued("b", 3, 2.0, 2)]
    page = queue_page(jobs, QueueOrder(), DrainRate(), now=1000.0)  # type: ignore[arg-type]
    assert [(q.job.id, q.position, q.estimated_start) for q in page.jobs] == [("b", 1, None), ("a", 2, None)]


def test_a_filtered_page_keeps_each_job_s_place_in_the_whole_queue() -> None:
    jobs = [
        Queued("x1", priority=9, ready_at=1.0, seq=1, type="x", owner="alice"),
        Queued("y1", priority=8, ready_at=1.0, seq=2, type="y", owner="bob"),
        Queued("x2", priority=7, ready_at=1.0, seq=3, type="x", owner="bob"),
        Queued("y2", priority=6, ready_at=1.0, seq=4, type="y", owner="alice"),
    ]
    rate = started(rate=1.0)
    by_type = queue_page(jobs, QueueOrder(), rate, 1000.0, job_type="y")  # type: ignore[arg-type]
    assert [(q.job.id, q.position) for q in by_type.jobs] == [("y1", 2), ("y2", 4)]
    assert by_type.total == 2
    by_owner = queue_page(jobs, QueueOrder(), rate, 1000.0, owners=["bob"], limit=1, offset=1)  # type: ignore[arg-type]
    assert [(q.job.id, q.position) for q in by_owner.jobs] == [("x2", 3)]
    assert by_owner.total == 2


def test_aging_ranks_a_long_wait_above_a_small_priority_gap() -> None:
    jobs = [Queued("old", priority=0, ready_at=0.0, seq=1), Queued("new", priority=2, ready_at=5.0, seq=2)]
    page = queue_page(jobs, QueueOrder(aging_sec=1.0), DrainRate(), now=10.0)  # type: ignore[arg-type]
    assert [q.job.id for q in page.jobs] == ["old", "new"]


queues = st.lists(
    st.tuples(st.integers(0, 100), st.floats(0, 1e6, allow_nan=False), st.sampled_from("xyz"), st.sampled_from("ab")),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    queues,
    st.sampled_from(["", "x", "y"]),
    st.sampled_from([(), ("a",), ("a", "b")]),
    st.integers(1, 20),
    st.integers(0, 70),
    st.sampled_from([0.0, 0.5, 30.0]),
)
def test_a_page_is_the_full_sort_filtered_and_cut(
    rows: list[tuple[int, float, str, str]],
    job_type: str,
    owners: tuple[str, ...],
    limit: int,
    offset: int,
    aging: float,
) -> None:
    jobs = [Queued(f"j{i}", p, t, i, ty, ow) for i, (p, t, ty, ow) in enumerate(rows)]
    order = QueueOrder(aging)
    # The reference: sort everything by the scheduler's own rank, number it, then filter and cut
    everything = sorted(jobs, key=lambda j: order.rank(j.priority, j.ready_at, j.seq))
    numbered = [(place, j) for place, j in enumerate(everything, 1)]
    kept = [
        (place, j)
        for place, j in numbered
        if (not job_type or j.type == job_type) and (not owners or j.owner in owners)
    ]
    page = queue_page(jobs, order, started(rate=4.0), 1000.0, job_type, owners, limit, offset)  # type: ignore[arg-type]
    assert [(q.position, q.job.id) for q in page.jobs] == [(place, j.id) for place, j in kept[offset : offset + limit]]
    assert page.total == len(kept)
    assert all(q.estimated_start == pytest.approx(1000.0 + q.position / 4.0) for q in page.jobs)


@given(st.lists(st.tuples(st.integers(0, 100), st.floats(0, 1e9, allow_nan=False)), max_size=30), st.floats(0, 1e4))
def test_ranks_are_rank_of_each_job(rows: list[tuple[int, float]], aging: float) -> None:
    order = QueueOrder(aging)
    jobs = [Queued(str(i), p, t, i) for i, (p, t) in enumerate(rows)]
    assert order.ranks(jobs) == [order.rank(j.priority, j.ready_at, j.seq) for j in jobs]
