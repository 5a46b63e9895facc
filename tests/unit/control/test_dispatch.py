"""Selection policies and thread-aware placement."""

import asyncio
from pathlib import Path

from control.admission import Submission
from control.clock import SystemClock
from control.config import ControlConfig
from control.dispatch import LeastLoaded, LeastRecentlyUsed, RoundRobin, granted_threads, reserve_for
from control.registry import WorkerEntry
from control.scheduler import Scheduler
from control.sessions import Hello, Outcome, Report, WorkerSessions
from control.store import SQLiteStore
from tests.support.links import RecordingLink
from tests.support.waiting import until


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


def test_a_job_waiting_for_threads_costs_no_dispatch_pass_until_something_frees_them(tmp_path: Path) -> None:
    """A deferred job used to ask for another pass, which deferred it again: a pass every loop turn, all
    the time it waited (61,424 passes in half a second, one core at 100%)."""

    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), SystemClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        passes = 0
        run = scheduler.dispatcher.run

        def counted() -> None:
            nonlocal passes
            passes += 1
            run()

        scheduler.dispatcher.run = counted  # type: ignore[method-assign]
        try:
            # Given a 4-thread worker running a 3-thread job, and a 4-thread job that must wait for it
            sessions.register(Hello("w1", threads=4, slots=4), link)
            (small,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}", thread_demand=3)])
            (big,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}", thread_demand=4)])
            assert [a.job_id for a in link.assigned] == [small.id]
            for _ in range(50):  # the submissions' own commits and passes settle
                await asyncio.sleep(0)
            # When the loop turns a thousand times more with nothing changing
            before = passes
            for _ in range(1000):
                await asyncio.sleep(0)
            # Then no pass ran meanwhile
            assert passes == before, passes - before
            # And the result that frees the threads starts the waiting job
            sessions.results("w1", [Report(small.id, 1, Outcome.SUCCEEDED, "{}")], link)
            await until(lambda: [a.job_id for a in link.assigned] == [small.id, big.id])
        finally:
            store.close()

    asyncio.run(main())


def test_cancelled_jobs_of_kinds_no_worker_serves_leave_nothing_parked(tmp_path: Path) -> None:
    """Parked jobs were dropped only when a worker had room for their kind: jobs no worker could ever run
    (a selector no worker matches), once cancelled, stayed parked, and each pass walked their kinds."""

    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), SystemClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        try:
            # Given jobs for 50 hosts no worker is on, each parked by a pass, then cancelled
            sessions.register(Hello("w1", threads=4, slots=4), link)
            for i in range(50):
                sub = Submission("noop", {}, payload_json="{}", worker_selector={"host": f"h{i}"})
                (job,) = await scheduler.intake.submit([sub])
                await until(lambda: bool(scheduler.dispatcher._parked))
                await scheduler.actions.cancel(job.id)
            # When the next pass runs (a job the worker takes)
            (noop,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}")])
            await until(lambda: [a.job_id for a in link.assigned] == [noop.id])
            # Then nothing is left parked
            assert scheduler.dispatcher._parked == {}
        finally:
            store.close()

    asyncio.run(main())
