"""The worker registry keeps the workers a job can go to now exactly, whatever happens to the fleet."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from control.api import convert
from control.registry import WorkerEntry, WorkerRegistry
from tests.support.links import RecordingLink

# (operation, worker index, attempt number): what the control plane does to its workers
OPS = st.lists(
    st.tuples(
        st.sampled_from(["register", "hold", "release", "drain", "disconnect", "reconnect", "remove"]),
        st.integers(0, 2),
        st.integers(0, 1),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
@example([("register", 0, 0), ("hold", 0, 1), ("release", 0, 1)])
@example([("register", 1, 0), ("hold", 1, 0), ("register", 2, 0), ("remove", 1, 0), ("register", 1, 0)])
def test_open_workers_and_the_capacity_are_exactly_what_a_walk_of_the_fleet_finds(
    ops: list[tuple[str, int, int]],
) -> None:
    registry = WorkerRegistry()
    for op, i, attempt in ops:
        wid = f"w{i}"
        worker = registry.get(wid)
        if op == "register":
            if worker is None:
                worker = WorkerEntry(
                    wid, threads=2 + i, slots=1 + i % 3, registered_at=0, last_seen=0, gpus=i, memory_mb=100 * i
                )
            worker.link, worker.draining = RecordingLink(), False
            registry.add(worker)
        elif worker is None:
            continue
        elif op == "hold":
            registry.hold(worker, (f"j{i}-{attempt}", attempt), 1)
        elif op == "release":
            registry.release(worker, (f"j{i}-{attempt}", attempt))
        elif op == "drain":
            worker.draining = True
            registry.changed(worker)
        elif op == "disconnect":
            worker.link = None
            registry.changed(worker)
        elif op == "reconnect":
            worker.link = RecordingLink()
            registry.changed(worker)
        elif op == "remove":
            registry.remove(wid)
        # Then the open workers are those a full walk of the fleet would find, in the order it walks
        assert registry.open() == [w for w in registry.all() if w.accepts_work]
        assert registry.has_capacity() == any(w.accepts_work for w in registry.all())
        # And the capacity, which fair share divides, is the connected workers'
        connected = [w for w in registry.all() if w.connected]
        assert registry.capacity() == (
            sum(w.threads for w in connected),
            sum(w.gpus for w in connected),
            sum(w.memory_mb for w in connected),
        )


def test_most_threads_for_a_type_counts_connected_workers_that_run_it() -> None:
    registry = WorkerRegistry()
    plain = WorkerEntry("plain", threads=4, slots=4, registered_at=0, last_seen=0, link=RecordingLink())
    gpu = WorkerEntry("gpu", threads=16, slots=1, registered_at=0, last_seen=0, link=RecordingLink())
    gpu.job_types = frozenset({"render"})
    registry.add(plain)
    registry.add(gpu)
    assert (registry.most_threads("render"), registry.most_threads("noop")) == (16, 4)
    # a worker that leaves no longer counts
    gpu.link = None
    registry.changed(gpu)
    assert (registry.most_threads("render"), registry.most_threads("noop")) == (4, 4)


def test_a_worker_selector_matches_labels_and_bounds_the_threads_a_job_can_get() -> None:
    registry = WorkerRegistry()
    small = WorkerEntry("small", threads=4, slots=4, registered_at=0, last_seen=0, link=RecordingLink())
    small.labels = {"gpu": "a100", "zone": "eu"}
    big = WorkerEntry("big", threads=32, slots=4, registered_at=0, last_seen=0, link=RecordingLink())
    big.labels = {"zone": "eu"}
    registry.add(small)
    registry.add(big)
    a100 = (("gpu", "a100"),)
    assert (small.matches(a100), big.matches(a100), big.matches(()), small.matches((("zone", "us"),))) == (
        True,
        False,
        True,
        False,
    )
    # a job that needs the GPU can get only as many threads as the GPU worker has
    assert (registry.most_threads("noop", a100), registry.most_threads("noop")) == (4, 32)
    assert registry.most_threads("noop", (("zone", "us"),)) == 0


def test_gpus_and_memory_held_come_back_exactly_when_their_attempt_is_released() -> None:
    registry = WorkerRegistry()
    w = WorkerEntry("w", 8, 8, registered_at=0, last_seen=0, link=RecordingLink(), gpus=4, memory_mb=4096)
    registry.add(w)
    registry.hold(w, ("a", 1), 1, (2, 1000))
    registry.hold(w, ("b", 1), 1)
    registry.hold(w, ("c", 1), 2, (1, 0))
    assert (w.free_gpus, w.free_memory_mb, w.free_threads) == (1, 3096, 4)
    assert not w.can_take(1, (2, 0)) and w.can_take(1, (1, 3096)) and not w.can_take(1, (0, 3097))
    assert (w.room_for((0, 0)), w.room_for((1, 0)), w.room_for((0, 1000)), w.room_for((2, 0))) == (5, 1, 3, 0)
    registry.release(w, ("a", 1))
    registry.release(w, ("a", 1))  # a second report of the same attempt frees nothing twice
    assert (w.free_gpus, w.free_memory_mb) == (3, 4096)
    # A reconnecting worker's word replaces what it holds
    registry.hold_only(w, {("c", 1): 2, ("d", 2): 1}, {("c", 1): (1, 0), ("d", 2): (2, 512), ("gone", 1): (1, 1)})
    assert (w.free_gpus, w.free_memory_mb, sorted(w.holding)) == (1, 3584, [("c", 1), ("d", 2)])


def test_most_threads_counts_only_workers_with_the_gpus_and_memory_asked_for() -> None:
    registry = WorkerRegistry()
    for wid, threads, gpus, memory in (("big", 32, 0, 64000), ("gpu", 8, 2, 16000)):
        registry.add(
            WorkerEntry(
                wid, threads, threads, registered_at=0, last_seen=0, link=RecordingLink(), gpus=gpus, memory_mb=memory
            )
        )
    assert registry.most_threads("noop") == 32
    assert registry.most_threads("noop", (), (1, 0)) == 8
    assert registry.most_threads("noop", (), (0, 20000)) == 32
    assert registry.most_threads("noop", (), (3, 0)) == 0


def test_a_worker_that_holds_more_than_it_has_shows_nothing_free_not_a_negative_count() -> None:
    # Given the entry a restarted control plane rebuilds from the store before its worker reconnects:
    # no threads, slots, GPUs or memory of its own, and a running job that holds some
    registry = WorkerRegistry()
    ghost = WorkerEntry("w-gone", threads=0, slots=0, registered_at=0, last_seen=0)
    registry.add(ghost)
    registry.hold(ghost, ("job-1", 1), 4, (1, 512))
    assert ghost.free_threads == -4  # what it owes, for the dispatcher
    # Then ListWorkers (and so `corral workers` and the dashboard) shows none free
    shown = convert.worker(ghost)
    assert (shown.free_threads, shown.free_slots, shown.free_gpus, shown.free_memory_mb) == (0, 0, 0, 0)
    assert list(shown.running_jobs) == ["job-1"]
