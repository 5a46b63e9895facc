"""Ready queue order (priority, then age; with aging, waiting raises priority) and lazy removal; delayed
queue by due time."""

import math

import pytest

from control.queue import DelayedQueue, QueueOrder, ReadyQueue


def test_priority_then_ready_time_then_sequence() -> None:
    live: dict[str, int] = {}
    q = ReadyQueue(lambda job_id, token: live.get(job_id) == token)
    for job_id, prio, ready, seq in [("a", 0, 1.0, 1), ("b", 5, 3.0, 2), ("c", 5, 2.0, 3), ("d", 0, 1.0, 0)]:
        live[job_id] = q.push(job_id, prio, ready, seq)
    assert [q.pop() for _ in range(5)] == ["c", "b", "d", "a", None]


def test_superseded_and_dead_entries_are_skipped() -> None:
    live: dict[str, int] = {}
    q = ReadyQueue(lambda job_id, token: live.get(job_id) == token)
    live["a"] = q.push("a", 0, 1.0, 1)
    live["b"] = q.push("b", 0, 2.0, 2)
    live["a"] = q.push("a", 0, 3.0, 1)  # re-queued later: the first entry is stale
    del live["b"]  # cancelled
    assert q.pop() == "a"
    assert q.pop() is None


def test_with_aging_each_aging_period_waited_is_worth_one_priority_level() -> None:
    live: dict[str, int] = {}
    q = ReadyQueue(lambda job_id, token: live.get(job_id) == token, QueueOrder(aging_sec=10.0))
    # ready at t=0 with priority 0; at t=35 (3.5 levels later) with priorities 3, 4 and 0
    for job_id, prio, ready, seq in [("old", 0, 0.0, 1), ("p3", 3, 35.0, 2), ("p4", 4, 35.0, 3), ("new", 0, 35.0, 4)]:
        live[job_id] = q.push(job_id, prio, ready, seq)
    assert [q.pop() for _ in range(5)] == ["p4", "old", "p3", "new", None]


def test_with_aging_equal_ranks_fall_back_to_ready_time_then_sequence() -> None:
    live: dict[str, int] = {}
    q = ReadyQueue(lambda job_id, token: live.get(job_id) == token, QueueOrder(aging_sec=1.0))
    # one level of waiting exactly makes up one level of priority: the one ready first goes first
    for job_id, prio, ready, seq in [("later", 1, 101.0, 1), ("b", 0, 100.0, 3), ("a", 0, 100.0, 2)]:
        live[job_id] = q.push(job_id, prio, ready, seq)
    assert [q.pop() for _ in range(3)] == ["a", "b", "later"]


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_aging_must_be_a_finite_number_of_seconds_or_zero(bad: float) -> None:
    with pytest.raises(ValueError, match="aging_sec must be >= 0"):
        QueueOrder(aging_sec=bad)


def test_delayed_queue_pops_what_is_due() -> None:
    d = DelayedQueue()
    d.push("late", 20.0)
    d.push("soon", 10.0)
    assert d.next_due() == 10.0
    assert d.pop_due(5.0) == []
    assert d.pop_due(15.0) == ["soon"]
    assert d.pop_due(25.0) == ["late"]
    assert d.next_due() is None
