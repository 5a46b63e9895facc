"""Selection policies and thread-aware placement."""

from control.dispatch import LeastLoaded, LeastRecentlyUsed, RoundRobin, granted_threads, reserve_for
from control.registry import WorkerEntry
from tests.support.links import RecordingLink


def worker(wid: str, threads: int = 1, slots: int = 1) -> WorkerEntry:
    return WorkerEntry(wid, threads, slots, registered_at=0, last_seen=0, link=RecordingLink())


def test_round_robin_takes_turns_and_skips_full_workers() -> None:
    ws = [worker("a"), worker("b"), worker("c")]
    rr = RoundRobin()
    assert [rr.choose(ws, 1).id for _ in range(4)] == ["a", "b", "c", "a"]  # type: ignore[union-attr]
    ws[1].running[("j", 1)] = 1
    assert [rr.choose(ws, 1).id for _ in range(3)] == ["c", "a", "c"]  # type: ignore[union-attr]


def test_thread_demand_places_only_on_workers_with_enough_free_threads() -> None:
    small, big = worker("small", threads=4, slots=4), worker("big", threads=8, slots=8)
    rr = RoundRobin()
    assert rr.choose([small, big], 8) is big
    big.running[("j", 1)] = 8
    assert rr.choose([small, big], 8) is None
    assert reserve_for([small, big], 8) is big


def test_demand_beyond_every_worker_is_capped_at_the_largest() -> None:
    assert granted_threads(16, 8) == 8
    assert granted_threads(2, 8) == 2
    assert granted_threads(3, 0) == 3


def test_least_recently_used() -> None:
    a, b = worker("a"), worker("b")
    a.last_assigned_at, b.last_assigned_at = 5.0, 1.0
    assert LeastRecentlyUsed().choose([a, b], 1) is b


def test_least_loaded_fills_a_mixed_fleet_evenly() -> None:
    big, small = worker("big", threads=8, slots=8), worker("small", threads=2, slots=2)
    policy = LeastLoaded()
    placed = []
    for i in range(10):
        w = policy.choose([big, small], 1)
        assert w is not None
        w.running[(f"j{i}", 1)] = 1
        placed.append(w.id)
    # each ends up with the same part of its threads in use: 8 of 8 and 2 of 2
    assert (placed.count("big"), placed.count("small")) == (8, 2)
    assert policy.choose([big, small], 1) is None
    # and an idle worker comes first
    assert LeastLoaded().choose([big, worker("idle", threads=1)], 1).id == "idle"  # type: ignore[union-attr]


def test_draining_and_disconnected_workers_take_nothing() -> None:
    a, b = worker("a"), worker("b")
    a.draining = True
    b.link = None
    assert RoundRobin().choose([a, b], 1) is None


def test_gpus_and_memory_place_only_where_they_are_free_and_are_never_scaled_down() -> None:
    plain = worker("plain", threads=8, slots=8)
    gpu = WorkerEntry("gpu", 8, 8, registered_at=0, last_seen=0, link=RecordingLink(), gpus=2, memory_mb=1000)
    rr = RoundRobin()
    assert rr.choose([plain, gpu], 1, (1, 0)) is gpu
    assert rr.choose([plain, gpu], 1, (0, 1000)) is gpu
    assert rr.choose([plain, gpu], 1, (3, 0)) is None
    assert LeastLoaded().choose([plain, gpu], 1, (2, 0)) is gpu
    assert LeastRecentlyUsed().choose([plain, gpu], 1, (0, 1001)) is None


def test_a_job_waiting_for_a_gpu_reserves_only_a_worker_whose_gpus_are_free() -> None:
    from control.registry import WorkerRegistry

    registry = WorkerRegistry()
    gpu = WorkerEntry("gpu", 4, 4, registered_at=0, last_seen=0, link=RecordingLink(), gpus=1)
    registry.add(gpu)
    registry.hold(gpu, ("long", 1), 1, (1, 0))
    # The GPU is busy: the waiting job reserves nothing, so plain jobs keep the worker's threads
    assert reserve_for([gpu], 1, (1, 0)) is None
    assert gpu.can_take(1)
    registry.release(gpu, ("long", 1))
    assert (gpu.free_gpus, gpu.can_take(1, (1, 0))) == (1, True)
    # The GPU is free but the threads are not: now it is reserved for the job
    for i in range(4):
        registry.hold(gpu, (f"plain{i}", 1), 1)
    assert reserve_for([gpu], 1, (1, 0)) is gpu
