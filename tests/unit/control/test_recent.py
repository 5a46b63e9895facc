"""RecentJobs: finished jobs kept for reads, bounded by count and by bytes."""

from control.jobs import JobRecord
from control.recent import RecentJobs


def job(i: int, result: str = "{}") -> JobRecord:
    j = JobRecord(id=f"j{i}", type="noop", payload_json="{}", created_at=0.0)
    j.result_json = result
    return j


def test_keeps_the_last_finished_and_drops_the_oldest_past_the_count() -> None:
    recent = RecentJobs(max_jobs=3)
    for i in range(5):
        recent.add(job(i))
    assert [recent.get(f"j{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert len(recent) == 3


def test_bytes_bound_drops_oldest_and_skips_a_job_too_large_to_keep() -> None:
    recent = RecentJobs(max_jobs=100, max_bytes=64 * 100)
    for i in range(3):
        recent.add(job(i, "x" * 90))  # 2 + 90 bytes each
    assert len(recent) == 3 and recent.bytes == 3 * 92
    recent.add(job(9, "x" * 64 * 100))  # over max_bytes / 64: not kept, nothing dropped for it
    assert recent.get("j9") is None and len(recent) == 3
    for i in range(3, 80):
        recent.add(job(i, "x" * 90))
    assert recent.bytes <= 64 * 100
    assert recent.get("j0") is None and recent.get("j79") is not None


def test_discard_forgets_and_counts_the_size_it_was_added_with() -> None:
    recent = RecentJobs()
    j = job(1, "x" * 10)
    recent.add(j)
    j.result_json = ""  # a re-driven job changes; the count must not drift
    recent.discard("j1")
    assert recent.get("j1") is None and recent.bytes == 0
    recent.discard("j1")  # twice is fine
    recent.add(j)
    recent.add(j)  # re-adding replaces
    assert len(recent) == 1 and recent.bytes == 2
