"""Ready queue order (priority, then age) and lazy removal; delayed queue by due time."""

from control.queue import DelayedQueue, ReadyQueue


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


def test_delayed_queue_pops_what_is_due() -> None:
    d = DelayedQueue()
    d.push("late", 20.0)
    d.push("soon", 10.0)
    assert d.next_due() == 10.0
    assert d.pop_due(5.0) == []
    assert d.pop_due(15.0) == ["soon"]
    assert d.pop_due(25.0) == ["late"]
    assert d.next_due() is None
